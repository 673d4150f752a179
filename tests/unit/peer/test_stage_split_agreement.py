"""The planner's idea of stage sizes must equal how peers actually cut the model."""
from hypothesis import given, strategies as st

from peer.compute.stages import layer_ranges
from protocol.topology import Workload


@given(st.integers(1, 64), st.integers(1, 16))
def test_workload_split_matches_peer_layer_ranges(layers, stages):
    if stages > layers:
        stages = layers
    w = Workload(num_layers=layers, num_stages=stages, microbatch_samples=1, microbatches_per_data_node=1,
                 activation_bytes_per_sample=1, memory_microbatches=1)
    assert w.layers_per_stage() == tuple(end - start for start, end in layer_ranges(layers, stages))
