"""Models and runtimes: the catalog, bundled files, loading, the lean Llama runtime, chat templates."""
