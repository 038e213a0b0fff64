"""infer's model-file layer: model references, GGUF checks (Hub, conversion, quantization later)."""
