"""A script run by spark-submit that starts no Spark session: it writes one small file to the directory it is
given (the OpenLineage test's producer, as cheap as a run can be)."""

import os
import sys

if __name__ == "__main__":
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], "part-0.txt"), "w") as out:
        out.write("a\nb\n")
