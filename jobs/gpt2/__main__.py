import sys

from spotray.jobs.gpt2.driver import main

if __name__ == "__main__":
    sys.exit(main())
