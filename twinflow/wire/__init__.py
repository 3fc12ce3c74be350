"""Generated gRPC stubs (``make proto`` writes them from ``proto/``). Do not edit."""
