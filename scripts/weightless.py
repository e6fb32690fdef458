"""weightless.py: strip_weights(model), shared by the scripts that save a
TorchScript architecture without its weights (samples/cpp-server,
samples/container, bench): every floating point parameter and buffer becomes
a stride-0 view of one zero, so names, shapes and dtypes stay right and the
saved file is tiny; tsar::bind then points the weights at an archive."""
import torch


def strip_weights(model):
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.is_floating_point():
                module._parameters[name] = torch.nn.Parameter(
                    torch.zeros(1, dtype=p.dtype).expand(p.shape), requires_grad=p.requires_grad)
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_floating_point():
                module._buffers[name] = torch.zeros(1, dtype=b.dtype).expand(b.shape)
    return model
