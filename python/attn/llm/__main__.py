"""python -m attn.llm [--path NAME]: the models attn knows by name (attn.llm.models), or one's path."""
import sys

from .models import main

sys.exit(main())
