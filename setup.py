"""Maps the repository layout onto two importable packages.

``libs/cellpilot`` is the shared library ``cellpilot``; ``services/`` holds one
sub-package per deployed service, importable as ``cellpilot_services.<name>``.
"""

from setuptools import find_packages, setup

ROOTS = {"cellpilot": "libs/cellpilot", "cellpilot_services": "services"}

packages = []
for name, path in ROOTS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(path)]

setup(
    packages=packages,
    package_dir=ROOTS,
    package_data={
        "": ["py.typed", "*.pyi", "*.sql", "*.proto", "static/*", "static/**/*", "templates/*", "data/*"]
    },
    include_package_data=True,
)
