// ZeroMQ
