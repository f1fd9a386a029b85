"""The contract these stubs were generated from."""

#: SHA-256 of the .proto files, as the daemon's GetServerInfo reports it.
CONTRACT_DIGEST = "35a8f6e23b691ebe2af51820264e34c2f42cb702c4bd377f982313a5f1ebf182"
