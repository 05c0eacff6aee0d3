import sys

from spotray.jobs.gpt2.train import main

if __name__ == "__main__":
    sys.exit(main())
