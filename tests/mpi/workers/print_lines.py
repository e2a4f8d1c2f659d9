"""Each rank prints lines of several arguments (an unbuffered print writes each piece on its
own), and a last piece with no newline."""
import os

rank = next((int(os.environ[v]) for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK") if v in os.environ), 0)
for i in range(30):
    print("rank", rank, "line", i, "checksum", 1234.5 * i)
print("rank", rank, "last words", end="")
