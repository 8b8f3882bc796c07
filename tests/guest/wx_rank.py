"""A serving rank for the guest tier: says whether it may map memory that is
both writable and executable (PyTorch, Triton and the CUDA JIT do; the
agent's own unit forbids it, the serving drop-in allows it), then becomes
the lab's vLLM stand-in with the arguments it was given."""

import mmap
import os
import sys

try:
    mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC).close()
    print("wx-mapping: allowed", flush=True)
except OSError as error:
    print(f"wx-mapping: refused ({error})", flush=True)
# /opt/spark-watchdog/bin is a link to the current release's bin: a python
# started through it finds no pyvenv.cfg next to it, the release's own does.
python = os.path.join(os.path.realpath(os.path.dirname(sys.executable)), "python")
os.execv(python, [python, "-m", "spark_watchdog.lab.hardware", "vllm", *sys.argv[1:]])
