"""The contract these stubs were generated from."""

#: SHA-256 of the .proto files, as the daemon's GetServerInfo reports it.
CONTRACT_DIGEST = "a5e959761f7879f5073ecfee86dc29fbb1ae2c7cdc2fad03228809a171b0ae36"
