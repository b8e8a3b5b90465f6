"""Write a copy of a GGUF with every quantized tensor dequantized to F32 (metadata kept).
Used by bench/ppl to compare against llama.cpp on exactly the weights our engine runs
(we dequantize Q4_1 to fp32; llama.cpp's Q4_1 matmul also quantizes activations to Q8_1).
usage: gguf_dequant.py IN.gguf OUT.gguf"""
import sys

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType

src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = GGUFWriter(dst + ".tmp", arch=arch)
for name, f in r.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    vt = f.types[0]
    if vt == GGUFValueType.ARRAY:
        w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1])
    else:
        w.add_key_value(name, f.contents(), vt)
for t in r.tensors:
    data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    shape = [int(x) for x in reversed(t.shape.tolist())]      # GGUF ne order -> numpy order
    w.add_tensor(t.name, data.reshape(shape), raw_dtype=gguf.GGMLQuantizationType.F32)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
import os
os.replace(dst + ".tmp", dst)
