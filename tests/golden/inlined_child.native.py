import torch
import operator

def __fx_f1(inp):
    mul_tensor = torch.ops.aten.mul.Tensor(inp, 3)
    del inp
    to = mul_tensor.to(device=__fx_c0)
    return (to, mul_tensor)

def execution_fn(x):
    getitem = __fx_s0(x, device=__fx_c0)[0]
    del x
    getitem_1 = __fx_f1(getitem)[0]
    del getitem
    return getitem_1
