"""The outputs of a bench/prune_recovery script's steps (steps.sh): NAME.out and NAME.s in
its work folder."""
import json
import os


class Outputs:
    def __init__(self, out):
        self.out = out

    def json(self, name):
        """The JSON a step wrote to NAME (a path under the work folder), or None."""
        p = os.path.join(self.out, name)
        return json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else None

    def wall(self, name):
        """The wall seconds of step NAME, or None when it did not finish."""
        p = os.path.join(self.out, name + ".s")
        return float(open(p).read()) if os.path.exists(p) else None
