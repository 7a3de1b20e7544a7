import sys

from gpushape.cli.main import main

sys.exit(main())
