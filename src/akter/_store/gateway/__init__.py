"""Store gateways: the statements of one area, with their parameters and connections."""
