"""Generated protobuf/gRPC stubs of the streamrl.v1 wire contract (see proto/). Do not edit."""
