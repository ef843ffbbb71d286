"""Not a training script: it never steps an optimizer."""
import time

print("preparing ...", flush=True)
time.sleep(60)
