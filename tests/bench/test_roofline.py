"""The roofline estimate's bytes per token follow the launcher's inputs and outputs for each variant name."""

from openrlhf_band.bench.roofline import FLAG_BYTES_PER_TOKEN, bytes_per_token


def test_bytes_per_token_by_dtype_radius_and_options():
    # fp32: log_probs 4 + old 4 + advantages 4 + mask 1; loss 4 + coefficient 4 + flags 4 + bounds 8; backward 12
    assert bytes_per_token("fwd-kl-scalar-scripts-fp32") == 13 + 20 + 12
    # 16-bit log-probs: 2 bytes less on the load and on the gradient, bf16 and fp16 alike
    assert bytes_per_token("fwd-kl-scalar-scripts-bf16") == bytes_per_token("fwd-kl-scalar-scripts-fp16") == 41
    assert bytes_per_token("fwd-kl-per-token-scripts-fp32") == 45 + 4  # the radius per token
    assert bytes_per_token("fwd-bounds-scripts-fp32") == 45 + 8  # given lower and upper
    assert bytes_per_token("fwd-kl-scalar-bare-fp32") == 45 - 1 - 8  # no mask, no bounds returned


def test_the_flag_bytes_are_the_kernels():
    from openrlhf_band.ops.band_loss import FORWARD_FLAG_BYTES_PER_TOKEN

    assert FLAG_BYTES_PER_TOKEN == FORWARD_FLAG_BYTES_PER_TOKEN
