import sys

from spotray.jobs.cnn.train import main

if __name__ == "__main__":
    sys.exit(main())
