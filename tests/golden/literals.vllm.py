import torch
import operator

def execution_fn(x, y=-0.0, *, __vllm_submods__):
    add_tensor = torch.ops.aten.add.Tensor(x, y, alpha=1)
    del x, y
    getitem = {'big': 1208925819614629174706176, 'neg': -18446744073709551616, 'b': (True, False, None), 'f': [float('inf'), float('-inf'), float('nan'), 1e+16, 0.1, 5e-324], 's': 'it\'s "q"\n\x00\xe9\U0001f600', 'by': b"\x00'\xff", 'one': (add_tensor,)}['one']
    del add_tensor
    return getitem
