import sys

from jobs.gpt2.train import main

sys.exit(main())
