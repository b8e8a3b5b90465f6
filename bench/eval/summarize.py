"""Print the markdown table of bench/results/eval_smollm2_<LIMIT>/<task>.json (written by
bench/eval/run_smollm2.sh): acc and acc_norm with standard errors, in percent."""
import json, os, sys

d = sys.argv[1] if len(sys.argv) > 1 else "bench/results/eval_smollm2_500"
order = ["arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande", "boolq", "openbookqa", "lambada_openai"]
print("| task | n (of) | acc ± stderr | acc_norm ± stderr | perplexity | truncated | items/s |")
print("|---|---|---|---|---|---|---|")
for t in order:
    p = os.path.join(d, t + ".json")
    if not os.path.exists(p):
        print(f"| {t} | not run | | | | | |")
        continue
    j = json.load(open(p))
    r = j["tasks"][t]
    if not r["ok"]:
        print(f"| {t} | error: {r['error']} | | | | | |")
        continue
    acc = f"{100 * r['acc']:.1f} ± {100 * r['acc_stderr']:.1f}"
    accn = f"{100 * r['acc_norm']:.1f} ± {100 * r['acc_norm_stderr']:.1f}" if "acc_norm" in r else "—"
    ppl = f"{r['perplexity']:.2f}" if "perplexity" in r else "—"
    print(f"| {t} | {r['n']} ({r['n_available']}) | {acc} | {accn} | {ppl} | {r['truncated']} | "
          f"{r['n'] / r['wall_s']:.2f} |")
