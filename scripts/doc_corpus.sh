#!/usr/bin/env bash
# A corpus of real English text for convergence runs (issue 28's bf16-vs-fp8 curves): the
# documentation that five Debian 12 packages ship, one document per source file, tokenized with
# GPT-2's BPE into DIR/docs_train and DIR/docs_valid (1% of the documents).
#   linux-doc-6.1      the kernel's reStructuredText (Documentation/**/*.rst.gz)
#   python3.11-doc     the reStructuredText sources of Python's manuals
#   perl-doc           Perl's POD manuals
#   git-doc            git's AsciiDoc manual pages
#   postgresql-doc-15  PostgreSQL's manual (HTML, tags stripped)
# The packages are pinned to the versions of 2026-12-06 and checked against their SHA-256, and so
# is the corpus they make: Debian's point releases replace them, and a corpus that moves under
# the runs moves every curve (bf16's end loss: 2.8465 on 2026-12-04's corpus, 2.8790 on 12-06's). When
# Debian no longer serves a pinned version, apt-get says so: fetch that .deb from
# snapshot.debian.org into DIR/debs (its checksum below still holds), then run this again.
# Needs the network (apt-get download), python3 and a built myriad. Writes only under DIR.
#   scripts/doc_corpus.sh DIR [MYRIAD]
set -euo pipefail
dir=${1:?usage: scripts/doc_corpus.sh DIR [MYRIAD]}
myriad=$(realpath "${2:-build/myriad}")
mkdir -p "$dir/debs" "$dir/x"
cd "$dir/debs"
pinned=(  # package=version sha256
  "linux-doc-6.1=6.1.192-3 f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f"
  "python3.11-doc=3.11.2-6+deb12u9 5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be"
  "perl-doc=5.36.0-7+deb12u4 f4269cff4576d6f02a6756df842988e58451c7e945b08517dd235531b24e48f8"
  "git-doc=1:2.39.5-0+deb12u3 3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec"
  "postgresql-doc-15=15.20-0+deb12u1 4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7"
)
for p in "${pinned[@]}"; do
  read -r pkg sum <<< "$p"
  name=${pkg%%=*} version=${pkg#*=}
  deb=$(ls "${name}_"*.deb 2>/dev/null | head -1 || true)
  [ -n "$deb" ] || { apt-get download "$pkg" && deb=$(ls "${name}_"*.deb | head -1); }
  echo "$sum  $deb" | sha256sum -c --quiet - ||
    { echo "doc_corpus.sh: $dir/debs/$deb is not $name $version (sha256 $sum); remove it and fetch that version" >&2; exit 1; }
done
for f in *.deb; do dpkg-deb -x "$f" ../x; done
cd ..
python3 - x docs.jsonl <<'PY'
import glob, gzip, html.parser, json, os, sys
root, out = sys.argv[1], sys.argv[2]
class Text(html.parser.HTMLParser):
    def __init__(s): super().__init__(); s.parts, s.skip = [], 0
    def handle_starttag(s, tag, a): s.skip += tag in ("script", "style")
    def handle_endtag(s, tag): s.skip -= tag in ("script", "style")
    def handle_data(s, d): s.parts.append("" if s.skip else d)
def html_text(raw):
    p = Text(); p.feed(raw); return "".join(p.parts)
sources = [  # (glob under root, reader)
    ("usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz", lambda p: gzip.open(p, "rt", errors="replace").read()),
    ("usr/share/doc/python3.11/html/_sources/**/*.txt", lambda p: open(p, errors="replace").read()),
    ("usr/share/perl/*/pod/*.pod", lambda p: open(p, errors="replace").read()),
    ("usr/share/doc/git-doc/*.txt", lambda p: open(p, errors="replace").read()),
    ("usr/share/doc/postgresql-doc-15/html/*.html", lambda p: html_text(open(p, errors="replace").read())),
]
n = size = 0
with open(out, "w") as f:
    for pattern, read in sources:
        for p in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            text = read(p)
            if text.strip():
                f.write(json.dumps({"text": text}) + "\n"); n += 1; size += len(text)
print(f"{n} documents, {size / 1e6:.1f} M characters in {out}")
PY
# The corpus of 2026-12-06's runs (docs/notes/fp8.md), byte for byte.
echo "1c9cdc1e03a234a3d944eecff404fed0511ae66c2f92ed23c1389933c55231c7  docs.jsonl" | sha256sum -c --quiet - ||
  { echo "doc_corpus.sh: $dir/docs.jsonl differs from the pinned corpus (sha256 1c9cdc1e...): the extraction changed" >&2; exit 1; }
"$myriad" prepare --input docs.jsonl --tokenizer gpt2 --output docs --valid-fraction 0.01
