import sys

from fxcodegen.cli import main

sys.exit(main())
