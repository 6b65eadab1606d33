"""``python -m attn.lab EXPERIMENT --out DIR`` runs one of attn.lab.experiments (as ``python -m
attn.lab.experiments``); ``python -m attn.lab report ...`` builds the report page (as ``python -m
attn.lab.report``)."""
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["report"]:
        from .report import main as report_main
        sys.exit(report_main(sys.argv[2:]))
    from .experiments import main
    main()
