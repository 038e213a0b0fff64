"""infer's inference runtime on llama.cpp's C API: model, context, sampling, sessions.

Importing the package imports nothing else: a client of a server (`infer run` with
INFER_SERVER) takes only the plain-data modules it needs (errors, results).
"""
