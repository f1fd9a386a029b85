"""The contract these stubs were generated from."""

#: SHA-256 of the .proto files, as the daemon's GetServerInfo reports it.
CONTRACT_DIGEST = "187be8426ff23e631519685735fc8103873082948cd85c1f2cec4dd8a62862ad"
