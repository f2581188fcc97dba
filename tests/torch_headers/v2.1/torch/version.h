// Signature check stub (tests/torch_headers/README.md): PyTorch 2.1.
#pragma once
#define TORCH_VERSION_MAJOR 2
#define TORCH_VERSION_MINOR 1
#define TORCH_VERSION_PATCH 0
