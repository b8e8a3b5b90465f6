# cuda/emu/prep.py — rewrites a .cu file for the SIMT emulator: kernel<<<grid, block, shm,
# stream>>>(args) becomes emu_launch(...), __shared__ becomes static (extern __shared__: extern).
import re, sys
src = open(sys.argv[1]).read()
src = src.replace('extern __shared__', 'extern').replace('__shared__', 'static')
out, i = [], 0
pat = re.compile(r'([A-Za-z_][\w]*(?:<[^<>;]*>)?)<<<')
while True:
    m = pat.search(src, i)
    if not m:
        out.append(src[i:]); break
    out.append(src[i:m.start()])
    j = src.index('>>>', m.end())
    cfg = src[m.end():j]
    # split cfg at top-level commas
    parts, depth, cur = [], 0, ''
    for ch in cfg:
        if ch in '([': depth += 1
        if ch in ')]': depth -= 1
        if ch == ',' and depth == 0: parts.append(cur); cur = ''
        else: cur += ch
    parts.append(cur)
    assert src[j+3] == '(', src[j:j+20]
    # find matching paren of args
    k, depth = j + 3, 0
    while True:
        if src[k] == '(': depth += 1
        elif src[k] == ')':
            depth -= 1
            if depth == 0: break
        k += 1
    args = src[j+4:k]
    shm = parts[2] if len(parts) > 2 else '0'
    out.append('emu_launch(dim3(%s), dim3(%s), (size_t)(%s), [&]{ %s(%s); })' % (parts[0], parts[1], shm, m.group(1), args))
    i = k + 1
open(sys.argv[2], 'w').write(''.join(out))
