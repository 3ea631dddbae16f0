"""Re-run the decode-speed fit of engine/sizing/backends.py: for each backend, (eta, t0) minimising the
points beyond 20 % first, then the squared relative error, with the calculator's own roofline bytes per step.
Run: python tests/fit_decode_speeds.py [-v]   (prints the table; the values in backends.py come from it)."""
import math
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1])); sys.path.insert(0, str(Path(__file__).resolve().parent))
import json
from engine.sizing.plan import Plan, Settings, Workload
from engine.sizing.models import get_model, parse_config_text
from engine.sizing.hardware import get_hardware, hardware_from_dict
from engine.sizing.formats import weight_format
D = json.loads((Path(__file__).parent / 'data' / 'decode_speeds.json').read_text())['points']
def hw_of(h):
    if isinstance(h, dict): return hardware_from_dict({k: v for k, v in h.items() if not k.startswith('_')})
    if '#' in h:
        base, i = h.split('#'); return get_hardware(base).variants[int(i) - 1]
    return get_hardware(h)
def model_of(m):
    return get_model(m) if isinstance(m, str) else parse_config_text(json.dumps(m['config']))
rows = []
for p in D:
    fw = p['framework']
    plan = Plan(model_of(p['model']), hw_of(p['hardware']), Workload(batch=p['batch'], prompt=p['prompt'], output=p['output'], context=p['prompt'] + p['output']),
                Settings(weights=p['weights'], framework=fw, tp=p['tp']))
    r = plan.speed(plan.batch, plan.context, efficiency=False)
    rows.append((p, r.decode_step_s - r.comm_s, r.comm_s, r.decode_bound, plan.fmt.eta_factor, r.decode_tokens_per_s))
def fit(rs, use_fmt):
    best = None
    for e in [i / 200 for i in range(40, 201)]:
        for t in [j * 0.0001 for j in range(0, 200)] + [0.02 + j * 0.001 for j in range(0, 60)]:
            errs = [((x / (e * (f if use_fmt else 1)) + c + t) * p['measured_tok_s'] - 1) for p, x, c, b, f, rf in rs]
            # error of predicted tok/s vs measured: pred = 1/step
            errs = [1 / (1 + er) - 1 for er in errs]
            worst = max(abs(v) for v in errs); ss = sum(v * v for v in errs)
            key = (sum(abs(v) > 0.2 for v in errs), ss)
            if best is None or key < best[0]: best = (key, e, t, errs)
    return best
import collections
by = collections.defaultdict(list)
for r in rows: by[r[0]['backend']].append(r)
for be, rs in by.items():
    for use_fmt in (False, True):
        (nfail, ss), e, t, errs = fit(rs, use_fmt)
        print(f"{be:16} fmt={use_fmt!s:5} n={len(rs)} eta={e:.3f} t0={t*1000:.2f}ms fail={nfail} rms={math.sqrt(ss/len(rs)):.3f} worst={max(errs, key=abs):+.3f}")
    if '-v' in sys.argv:
        (nfail, ss), e, t, errs = fit(rs, False)
        for (p, x, c, b, f, rf), er in zip(rs, errs):
            print(f"   {p['id']:22} {p['hardware'] if isinstance(p['hardware'], str) else p['hardware']['name']:28} {p['weights']:5} B{p['batch']:<3} meas {p['measured_tok_s']:8.2f} roof {rf:8.1f} {b} err {er:+.3f}")

CHOICE = {"llama.cpp-metal": (False, None), "llama.cpp-cuda": (False, None), "llama.cpp-cpu": (False, None),
          "vllm-cuda": (True, None), "sglang-cuda": (True, "vllm-cuda"), "mindie": (True, None)}
def fit2(rs, use_fmt, etas):
    best = None
    for e in etas:
        for t in [j * 0.00005 for j in range(0, 1000)]:
            errs = [p['measured_tok_s'] * (x / (e * (f if use_fmt else 1)) + c + t) for p, x, c, b, f, rf in rs]
            errs = [1 / v - 1 for v in errs]
            key = (sum(abs(v) > 0.2 for v in errs), sum(v * v for v in errs))
            if best is None or key < best[0]: best = (key, e, t, errs)
    return best
final = {}
for be in CHOICE:
    use_fmt, share = CHOICE[be]
    etas = [final[share][0]] if share else [i / 1000 for i in range(400, 1001, 5)]
    (nf, ss), e, t, errs = fit2(by[be], use_fmt, etas)
    final[be] = (e, t)
    fails = [p['id'] for (p, *_), er in zip(by[be], errs) if abs(er) > 0.2]
    print("FINAL", be, f"eta={e:.3f} t0_ms={t*1000:.2f} fmt={use_fmt} n={len(errs)} pass={len(errs)-nf} worst={max(errs, key=abs):+.3f} worst_pass={max((abs(v) for v in errs if abs(v)<=0.2), default=0):.3f} fails={fails}")
