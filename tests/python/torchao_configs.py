"""The torchao configurations this CPU quantizes with (issue 58), for the
tests of quantized weights: name -> (a function making the config, the class
of the tensors it makes). Import it after pytest.importorskip("torchao")."""
import warnings

import torch

warnings.filterwarnings("ignore", module="torchao")
from torchao.quantization import (  # noqa: E402
    Float8WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
    IntxWeightOnlyConfig)
from torchao.quantization.granularity import PerGroup  # noqa: E402

CONFIGS = {
    "int8_weight_only": (lambda: Int8WeightOnlyConfig(), "Int8Tensor"),
    "int8_dynamic": (lambda: Int8DynamicActivationInt8WeightConfig(), "Int8Tensor"),
    "int4_intx": (lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
                  "IntxUnpackedToInt8Tensor"),
    "float8_weight_only": (lambda: Float8WeightOnlyConfig(), "Float8Tensor"),
}
