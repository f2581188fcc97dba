// Signature check stub (tests/torch_headers/README.md): PyTorch 2.3.
#pragma once
#define TORCH_VERSION_MAJOR 2
#define TORCH_VERSION_MINOR 3
#define TORCH_VERSION_PATCH 0
