#!/usr/bin/env python3
"""Writes models/data/replicate_net_shuffled.safetensors: test_replicate's _compare_module data
for models/replicate_net.yaml. input and target ~ torch.randn(2, 2) (torch.manual_seed(0)); step 1
trains on the input's rows in another order while the target keeps its order, as the seed shuffles
`input` between iterations. (The seed's own randperm(2) under manual_seed(0) happens to be the
identity; the rows are swapped here so that the shuffle changes what each rank sees.)

    /usr/bin/python3 tools/make_replicate_data.py models/data/replicate_net_shuffled.safetensors
"""
import sys

import torch

from torch_model import write_safetensors

torch.manual_seed(0)
inp, target = torch.randn(2, 2), torch.randn(2, 2)
write_safetensors(sys.argv[1], [("input", inp), ("target", target), ("step1.input", inp[torch.tensor([1, 0])])],
                  {"made_by": "tools/make_replicate_data.py"})
