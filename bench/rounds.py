"""The raw outputs of alternating benchmark rounds: "name value unit" lines, one file per
process (DIR/KIND.ROUND). Shared by the run.sh scripts that alternate peers."""
import statistics


def read(path):
    """name -> float value (or the word, when it is not a number)."""
    d = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 2:
            try:
                d[f[0]] = float(f[1])
            except ValueError:
                d[f[0]] = f[1]
    return d


class Rounds:
    def __init__(self, tmp, rounds, kinds):
        self.runs = {k: [read("%s/%s.%d" % (tmp, k, r)) for r in range(1, rounds + 1)] for k in kinds}

    def values(self, kind, key):
        return [r[key] for r in self.runs[kind] if isinstance(r.get(key), float)]

    def med(self, kind, key):
        v = self.values(kind, key)
        return statistics.median(v) if v else None

    def rng(self, kind, key):
        v = self.values(kind, key)
        return "%.1f–%.1f" % (min(v), max(v)) if v else ""
