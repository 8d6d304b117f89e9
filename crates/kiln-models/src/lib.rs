//! kiln-models: kiln: model architectures generic over Backend
