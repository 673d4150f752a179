"""Suite-wide settings."""
import torch

# On a small shared machine, intra-op threads slow tiny matmuls down by orders of magnitude.
torch.set_num_threads(1)
