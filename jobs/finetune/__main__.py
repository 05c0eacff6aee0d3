import sys

from spotray.jobs.finetune.train import main

if __name__ == "__main__":
    sys.exit(main())
