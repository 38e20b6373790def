"""The gRPC edge, in one place: protobuf <-> domain conversion (convert), the FetchWeights
codec (codec) and weight transfer over it (transfer), channel and server options with the
spec's security (channels). Nothing outside this package builds or reads a protobuf message."""
