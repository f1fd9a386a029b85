"""Generated from proto/ctxbroker/v1/broker.proto by tools/generate.py."""
