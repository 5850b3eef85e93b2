"""The testbed's shape: no function over 100 lines (a long one is split by stage)."""

import ast
import pathlib
import unittest

HERE = pathlib.Path(__file__).parent
LIMIT = 100


class Shape(unittest.TestCase):
    def test_no_function_is_over_100_lines(self):
        long = []
        for path in sorted(HERE.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > LIMIT:
                        long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
        self.assertEqual(long, [], "split these by stage")


if __name__ == "__main__":
    unittest.main()
