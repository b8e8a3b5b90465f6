"""Tokenize a whole text file with llama.cpp (llama-cpp-python, vocab only) and with our
tokenizer (tools/ac_tokenize) and report whether the id sequences are identical.
usage: tokcmp.py MODEL.gguf TEXT AC_TOKENIZE  -> one JSON line"""
import json, subprocess, sys

from llama_cpp import Llama

model, text_path, tool = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(text_path, encoding="utf-8", newline="").read()
llm = Llama(model_path=model, n_ctx=64, verbose=False, vocab_only=True)
ref = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
out = subprocess.run([tool, "gguf", model], input=json.dumps([text]), capture_output=True, text=True, check=True)
ours = json.loads(out.stdout)[0]["ids"]
first = next((i for i, (a, b) in enumerate(zip(ref, ours)) if a != b), None)
print(json.dumps({"llama_cpp_tokens": len(ref), "our_tokens": len(ours), "identical": ref == ours,
                  "first_difference": first}))
