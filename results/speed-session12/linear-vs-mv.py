# One-row torch.nn.functional.linear (LibTorch 1.13: sgemm) against torch.mv (gemv) at the small-llama
# projection shapes, 2 threads. Run with the suite stopped:
#   OPENBLAS_CORETYPE=Cooperlake /usr/bin/python3 results/speed-session12/linear-vs-mv.py
import torch, time
torch.set_num_threads(2)
for (o, i) in ((4096, 512), (1536, 512), (512, 512), (2048, 512)):
    W = torch.randn(o, i); x = torch.randn(1, i)
    def t(f, n=2000):
        for _ in range(50): f()
        t0 = time.perf_counter()
        for _ in range(n): f()
        return (time.perf_counter() - t0) / n
    a = t(lambda: torch.nn.functional.linear(x, W))
    b = t(lambda: torch.mv(W, x[0]))
    gb = o * i * 4 / 1e9
    print(f"{o}x{i} ({gb*1e3:.1f} MB): linear {a*1e6:.1f} us {gb/a:.1f} GB/s; mv {b*1e6:.1f} us {gb/b:.1f} GB/s")
