"""The contract these stubs were generated from."""

#: SHA-256 of the .proto files, as the daemon's GetServerInfo reports it.
CONTRACT_DIGEST = "4b19cf5ed578ad5a896f40a5dc132931ae9a6fc81cc07c8d55082ebe248b1251"
