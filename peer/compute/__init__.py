"""Model definition and per-stage compute. Imports torch and protocol only (no networking).

model.py         ModelConfig registry, the LLaMA-style Decoder, deterministic per-part init
stages.py        layer_ranges, build_stage -> StageModule, reference_forward
runner.py        StageRunner: forward/backward with an activation stash, sample-normalised AdamW
tensor_codec.py  torch.Tensor <-> protocol.tensors.TensorPayload (raw bytes, never pickle)
errors.py        BadTensor, StashFull, UnknownMicrobatch, OutOfOrder, WrongStage (wire codes)
device.py        --gpu/--device checks (exit 2 on a bad GPU), --max-vram cap, up-front memory reservation
precision.py     bf16 autocast on CUDA with fp32 master weights; the dtype tensors travel in
host_buffers.py  DeviceIO: pinned host buffers and non-blocking copies (no-op on CPU)
"""
