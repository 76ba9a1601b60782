"""Loaded at start-up by Python processes whose PYTHONPATH holds this folder (the tests of `--push_to_hub`):
huggingface_hub's repository creation and folder upload record what they would send to $UPLOAD_CAPTURE (JSON)
instead of using the network. A test process installs `recorders(path)` itself."""

import json
import os


def recorders(path: str):
    """Stand-ins for `HfApi.create_repo` and `HfApi.upload_folder` that write what would be sent to `path`."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    created = {}

    def create_repo(self, repo_id, private=False, **kwargs):
        created["private"] = private
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, allow_patterns=None, ignore_patterns=None, **kwargs):
        paths = sorted(os.path.relpath(os.path.join(root, name), folder_path).replace(os.sep, "/")
                       for root, _, names in os.walk(folder_path) for name in names)
        files = list(filter_repo_objects(paths, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"repo_id": repo_id, "files": files, **created}, f)

    return create_repo, upload_folder


if os.environ.get("UPLOAD_CAPTURE"):
    import huggingface_hub

    huggingface_hub.HfApi.create_repo, huggingface_hub.HfApi.upload_folder = recorders(os.environ["UPLOAD_CAPTURE"])
