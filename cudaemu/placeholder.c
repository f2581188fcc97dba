int cudaemu_placeholder(void); int cudaemu_placeholder(void) { return 0; }
