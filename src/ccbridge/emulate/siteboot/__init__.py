"""The sitecustomize shim and call-site recorder ccbridge puts on a traced program's PYTHONPATH."""
