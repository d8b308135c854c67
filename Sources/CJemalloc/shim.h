// Nothing to declare: linking the library is what matters (see `import CJemalloc` in the storekeeper program's main.swift).
