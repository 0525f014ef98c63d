"""tpu tensors: the storage cell, the runtime kernels, and moving tensors between processes."""
