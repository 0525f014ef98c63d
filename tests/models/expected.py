"""Zoo cases that do not match the CPU, keyed by (case name, attention implementation or
"*"), each with what differs and why. Every entry is a claim that the difference is
understood; a case listed here that passes fails its test."""

EXPECTED_FAILURES: dict[tuple[str, str], str] = {}

# --- vision (tests/models/zoo_vision.py) ---
EXPECTED_FAILURES[("mobilenet-v2", "*")] = (
    "float32 conditioning, not a tpu error: 52 conv+BatchNorm layers in train mode (HF's fixed "
    "MobileNetV2 depth), each BatchNorm backward cancelling most of its input, leave float32 gradients "
    "of the first layers ~1e-3 (relative) from float64 on both devices. 21 of 160k gradient elements "
    "miss rtol 1e-3, e.g. conv_stem.first_conv.convolution.weight.grad[103] = cpu -0.594649, tpu "
    "-0.593858, float64 -0.594961; over those 21 elements sum |cpu-f64| = 3.5e-3 and sum |tpu-f64| = "
    "5.0e-3 (same size; neither device is systematically off). After float64 arbitration (compare.py) "
    "4 gradient tensors keep elements where tpu is farther from float64 than the CPU by more than the "
    "tolerance (max abs 1.75e-3 in the stem). No ReLU6 input of this run lies on the other side of a "
    "kink (0 or 6) from float64 on either device (checked), so this is BatchNorm's cancellation noise, not a "
    "branch flip. (With 8 images instead of 2, one BatchNorm output lands at +4.6e-7 on the CPU and -1.8e-7 "
    "on tpu, its ReLU6 gradient flips, and train-mode BatchNorm spreads it over the channel: the stem "
    "gradients then differ by 0.08 of 35. The zoo keeps 2 images.) Forward and the SGD step match"
)
EXPECTED_FAILURES[("mobilenet-v1", "*")] = (
    "float32 conditioning, not a tpu error: 27 depthwise/pointwise conv + train-mode BatchNorm + ReLU6 "
    "layers; 2 of 213k gradient elements miss rtol 1e-3, e.g. conv_stem.convolution.weight.grad[14] = "
    "cpu 0.209664, tpu 0.209998 (|diff| 3.3e-4, 1.6e-3 relative). float64 gives 0.0424 there: some ReLU6 "
    "input lies within float32 rounding of its kink, so float32 (both devices) and float64 take different "
    "branches, and the stem gradient is that sensitive to rounding (|cpu-f64| and |tpu-f64| summed over "
    "the failing elements: 0.443 and 0.444), so float64 cannot arbitrate. Forward and the SGD step match"
)
