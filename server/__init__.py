"""`infer serve`: the HTTP front end (OpenAI-compatible API) over the runtime's engines."""
