"""Print every --option the Megatron-LM argument parser of a source tree defines (megatron/training/arguments.py
add_megatron_arguments), one per line with its choices, for integrations/megatron_releases/<tag>.txt.

Usage, from a folder holding a release's `megatron` package (`git archive core_v0.19.0 megatron | tar -x`):
    python megatron_release_args.py > integrations/megatron_releases/core_v0.19.0.txt   (then add the header)
Optional third-party modules that the parser's imports reach but never use (TransformerEngine, triton, ...) get
stand-ins, and Python 3.12's typing.override is a no-op on 3.11: only the parser is built, nothing runs."""
import argparse, importlib.abc, importlib.machinery, os, sys, types
ROOT = os.getcwd() + '/megatron'
sys.path.insert(0, '.')
import typing
if not hasattr(typing, 'override'):  # Python 3.12's typing.override, a no-op decorator
    typing.override = lambda f: f
import torch, torch.distributed, torch.distributed.tensor, numpy, packaging.version  # real ones, before stubbing


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith('__') and name not in ('__version__',):
            raise AttributeError(name)
        if name == '__version__':
            return '99.0.0'
        sub = _Meta(name, (object,), {'__init__': lambda self, *a, **k: None,
                                       '__call__': lambda self, *a, **k: (a[0] if a and callable(a[0]) else self), '__iter__': lambda self: iter(())})
        setattr(cls, name, sub)
        return sub


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith('__'):
            if name == '__version__':
                return '99.0.0'
            raise AttributeError(name)
        sub = _Meta(name, (object,), {'__init__': lambda self, *a, **k: None,
                                       '__call__': lambda self, *a, **k: (a[0] if a and callable(a[0]) else self), '__iter__': lambda self: iter(())})
        setattr(self, name, sub)
        return sub


class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split('.')[0]
        if top == 'megatron' or top.startswith('_') or top in sys.stdlib_module_names:
            return None
        if isinstance(sys.modules.get(top), StubModule):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        f = sys._getframe(1)
        while f and f.f_code.co_filename.startswith('<frozen'):
            f = f.f_back
        if not (f and f.f_code.co_filename.startswith(ROOT)):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(name, path, target)
            except Exception:
                spec = None
            if spec is not None:
                return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.append(Stub())
from megatron.training.arguments import add_megatron_arguments
p = argparse.ArgumentParser(allow_abbrev=False)
add_megatron_arguments(p)
lines = set()
for a in p._actions:
    choices = ' '.join(str(c) for c in a.choices) if a.choices else ''
    for o in a.option_strings:
        if o.startswith('--'):
            lines.add(f"{o[2:]} {choices}".strip())
print('\n'.join(sorted(lines)))
