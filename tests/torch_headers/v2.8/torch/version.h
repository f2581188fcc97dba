// Signature check stub (tests/torch_headers/README.md): PyTorch 2.8.
#pragma once
#define TORCH_VERSION_MAJOR 2
#define TORCH_VERSION_MINOR 8
#define TORCH_VERSION_PATCH 0
