"""Object stores (S3-compatible servers and plain directories), hashed parallel downloads, the embedded S3 server."""
