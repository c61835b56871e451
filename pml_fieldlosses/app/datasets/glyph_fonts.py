"""The font packages of the ``glyphs`` data set, pinned: ``@fontsource/<font id>`` at
the version and sha512 that the npm registry served when the set was pinned, and the
licence of each family as google-font-metadata's licenses.json states it (else, for the
families it lacks, the package's own metadata.json; the build checks both against these).
The families are those that glyphs.choose_families picks from google-font-metadata@6.0.8
and that have an @fontsource package. A new pin may draw other images: bump
glyphs.BUILD_VERSION with it.
"""

from .npm import NpmPackage

# the licences, by the SPDX id that the @fontsource packages use, as licenses.json names them
LICENSE_NAMES = {
    "OFL-1.1": "SIL Open Font License, 1.1",
    "Apache-2.0": "Apache License, Version 2.0",
    "UFL-1.0": "Ubuntu Font License, 1.0",
}

# font id, version, licence (SPDX id), sha512 integrity of the tarball
PINS = """
advent-pro 5.3.0 OFL-1.1 sha512-ordTtEiavlCF5p6wnW8TFYSVPu87RlTY7ngnsRBtqKdhyPuOSnQaa54nvDlni5y6SQfm16IFFM7rqVlBBPujrA==
alegreya 5.3.0 OFL-1.1 sha512-YCsp9dHYfMNdggXxinMMS0nkGlZkzs2MvPL7qPVjSO4DM1uJ29hmKEdTC/fBP+2K4Aa+4Z44JuOQz05eDcvNJA==
alegreya-sans 5.3.0 OFL-1.1 sha512-Uf0RbuwzhSS3NQrBFcRzEUm7TxDQW3qdAbQ6JIOhsIW6V+YN2dqlR99lhfEE38R3GHgMCMJBzqSp7aJxhNXSOw==
alice 5.3.0 OFL-1.1 sha512-R9J/EiE8T4U8fDIjiXlvgaInqOw/gqeDO60x0+wIEg8i74BHKxC/1qO/SQuhcVI6gb9lTccFBUaMvHRxfc3deg==
alumni-sans 5.3.0 OFL-1.1 sha512-WinRdWgUNrt8uc6Qsk0lD7bDBW/Lq1mMTbyPNFynW4c60R70XxoSwCDIUe/pP1gC+Bw+GUmRG/7cND7X/WePYw==
alumni-sans-pinstripe 5.2.7 OFL-1.1 sha512-Y+GjVqXwG65w2Gf2gla1Hg+c2nrUI7Lw14hNBQWtIk/afSnsHpDsmR98eKD5MsGPiIk9WuTsJfyZBD7N5BzYRQ==
andika 5.3.0 OFL-1.1 sha512-m15/VavWcrOhTJr4xXVKTKrJgI8Ny4fI52ZwcoYH3kH6IyLpAfuYUuFouI223WFbDP0kwvKsOOankklFNyMvNw==
anonymous-pro 5.3.0 OFL-1.1 sha512-zoJ/iLJYCkMsjwEgqM6rQr2KmRk+v9+G90NOPxBm1RCN2rjX5kk0t0MoUkzYMT+51jWuIfPGCD/YcZXlNFqMKA==
arimo 5.3.0 Apache-2.0 sha512-nhxZ2sTVZYX8DJBgLuyX360B5vE4mxqpmjlKTRfucIqfcWRVx9vOYzWBc1IgEX0ist48VMC10PRKbFyH+4QFvQ==
arsenal 5.3.0 OFL-1.1 sha512-Vrd5aEEr+E7C1pFyeYHJLQSBNT6mXX7KWWeTDWDirannW5DQXMAqP2Y7WDGG8B6ra+fRqnZ7SomZREYm4UrvQQ==
bad-script 5.3.0 OFL-1.1 sha512-7MElotXA5LHyvyElVXnwPpT71wYSKLmpvm7TV0e4ahaRP6D1vXocyfHOgENi9MHgRmGxhmz7Gr1fDuji0MNvkQ==
balsamiq-sans 5.3.0 OFL-1.1 sha512-ofkLqr8IH+TVP3q385lkonHo5yrbn59jbax9sEknRcwpxP/yX+gDd+hufeGw3fcIaRVWDN2TdhTMFCjdvw8utA==
bitter 5.3.0 OFL-1.1 sha512-RYfrDnaja7v6FO8AwknA5aw/BuVgLBJvwLIShkS42XUIxMbvi/yp47Ax/Xnn9OTVIGFiTXCbVsH0O9HhTTDtqA==
bona-nova 5.3.0 OFL-1.1 sha512-5ADvMRF4EoB0F+xCBjqv+7AQQ8woXKn4Zsv6J7+3dvVR9m5/MtFZcjizOY6Xunrpew21EFI8LFAH5OM5AJh7yg==
brygada-1918 5.3.0 OFL-1.1 sha512-bC9OHiRnqb+oSpaTFFSkm6OGFk7SkSkYfa9BjXXIJqYqcZZaRR0U0ZKqmmOaXy7LhSEeTAkFJDaMayinuXvYOQ==
carlito 5.3.0 OFL-1.1 sha512-oPqvLGK/dtVzC4KjdDcV/YzQq37sZdMXxD58ADvguPo3dm6yzbBKs40ADmevJF0wLvyvJY7/fPl5YkCQ1njWUw==
cascadia-code 5.3.0 OFL-1.1 sha512-XEGnkay3kCOAJXcrZqokezGlw1sATtpqOMOrBOuvYt6Bj6EaejU2BvO1q8AdWdNfDQ4AoYP/Zs30QRY5m9UEZw==
cascadia-mono 5.3.0 OFL-1.1 sha512-50GR+UT8w92Gzg5QWHQWe7arIfogm6VrpEqUx9K/YK/MgbwS2GaBx/Dfd+sE8uAQu6btnbDFq9ezrOC41fgo0g==
caveat 5.3.0 OFL-1.1 sha512-eHTfzQxFSW9ABERRLNruHoNJmKed2J7pqTUc5lp4a4POMgXGKpxmWj3d9Hz10kmAg6iuTTLe6UagbA4bnsmfQw==
charis-sil 5.3.0 OFL-1.1 sha512-dYGYYfCsGKQ3SxHayhR3XS4OUPk57UiODUgI4KCOBH7edqPZi2ZfZB/opwk7vu1FhztMaQc3uHJmgjpgikeIsA==
chiron-goround-tc 5.3.0 OFL-1.1 sha512-G74AnizFegtiOx+Y4c4HggAma6f4xsKuhZziut5mUy4iHLOgfJdzgXrNzqdQ7nblY9eSuhJy3PcOJ36l9/dfug==
chiron-hei-hk 5.3.1 OFL-1.1 sha512-WXiSVgnp+ZzlzVJzDxVJYYBgpuMLIlhi+TijOOrLm80v27eHoQzKEachBMWIPY8Z7L2ocrRbsVyayBV1LJJx5w==
comfortaa 5.3.0 OFL-1.1 sha512-ab4DERH0q6ko8QCpEZzOV9ebK39LgQ2oM91AkLNqu0VIxxwT0nV2D3sOuI7iLirWWq4IMooaIN6/2llxrDN2JA==
comic-relief 5.3.0 OFL-1.1 sha512-MC00QAh/tMpwmdcQwcaDfUQg28izTrmj3UfjAzTL8OeZKuVhlwLN21KH2MbRNJ8BjD08alVTPaUUB6Z19PtRWw==
commissioner 5.3.0 OFL-1.1 sha512-G3OnulmWmCVSn2qvOsWDQSObOVsDpAsrDM7HL2rtJLYA+U2ly1Ldg5YwEKKiv1inDLhUkwK3u0V6jmMva8vksA==
cormorant 5.3.0 OFL-1.1 sha512-r2xrO2/35L+miyYFaERPRn3TGA8G83fKAR4wGG3s4WC5pLRZ7Cw3brDjr8tRwESCHXgB3r7jZqjfK2kLPv3zrQ==
cormorant-garamond 5.3.0 OFL-1.1 sha512-weuGsCirGVWBWqpt6YUp0yLThTe4G8YO45noq8wxeJCRvEpq5lFrxNMFSTxcyOyV5k5otzJ8guDzYegdYlcLMQ==
cormorant-infant 5.3.0 OFL-1.1 sha512-sxejMT5hIkSGSkY3UDjWP/Y3fXs+sjeqVKUxrZ2M81mVMT0IBPVMeb2OwI+hblb8JcYciIv8ghkpOByAySUK1g==
cousine 5.3.0 OFL-1.1 sha512-EhVes1KpHrmPwGVCoVxYpdiIi/L2LRGxbAuv07m3TdY76f9Vmwyhd/TNqi2RC0NOvMCNt2FtYPJcAfFfkK9DoQ==
cuprum 5.3.0 OFL-1.1 sha512-Jd0FHkLcKZAJDK/T0SIcZESf90f10aBoiy1FBK1Vgp8tCYpnzVXZP5JtWzuGzjlJ05lZPO+sUUWqJH0fwHXxcA==
dela-gothic-one 5.3.0 OFL-1.1 sha512-4A26Qs7TqYFWegJfYHx7KKWy01YybW/e7uhFDM8A8e1neVPm721laLnh0en60wtKihfNdCbJt0VVcEMHC4pHjw==
didact-gothic 5.3.0 OFL-1.1 sha512-2+hsqmFYv0wYob4yPqvyOySq9+JuL0yUolNTcJIhrYnZhAUNohtW9MyYft1NNnD82n7ZuJ1Jw3wT7TnxPZuojw==
eb-garamond 5.3.0 OFL-1.1 sha512-VplwHpB8FLuzl+4G5LDci1b3Z4SghiuXH8XEgaxjnOb5aue5mEt1njmDKeO6iyLeGa73LffU7PC7hzncLRx0ZA==
exo-2 5.3.0 OFL-1.1 sha512-jVI6qXPPuV1Fne7m2Hpyc9rTt4O7ZIo+wsUZZzAW+u/iHem4CyWXXCGUoSw3utZUW82/bsGVQO9yO+hDsjZH8A==
finlandica 5.2.10 OFL-1.1 sha512-Hppou5Fpm55QHafvXTopCoaC1l9csSxRyn3zNtKXcLrki2NN08i0XEX2QZXArmQ7ySJ+Uy4Vu7HT/z8tt6I7CA==
fira-code 5.3.0 OFL-1.1 sha512-EJL968RJRkakubAj/coU8pSUaeTE5UNoRjtzAr6kGiSZ3jWuN8/AKWHwym/PFUaQL1q7IL/H+EXs4358YhrTBQ==
fira-mono 5.3.0 OFL-1.1 sha512-FZzRwKhpoXQU1uhEGKUg5AHUUdfiaTXxGCdBBeGHUmcZaqEDEmndSVvpXHkSViH25f/UiWfhcWTib+6A8o4qeQ==
fira-sans 5.3.0 OFL-1.1 sha512-z1SKSG7eRhm3srlb7rQ3j77QP4TP7OFxCZ4wUWhCdt+3hOF9K0AyvybpAsz6+JWNcCVV7AqC7dbOT3e67P2r5A==
fira-sans-condensed 5.3.0 OFL-1.1 sha512-aYiPJnAwfvhHW1Yra+YPGdFvhvJhQax1wHb6aa6979ixPe51CspvxgZTJ8JNfIs3Gu7UcclUl6d2MuDnw1wsdg==
fira-sans-extra-condensed 5.3.0 OFL-1.1 sha512-AiwnJulSkWNY0SYSOmdf3oFO9G8Soc3FYyYS81BWXVUSLqj2V/YXf4vC9xTohLOPIbXnDbpeelje692zLT5O6w==
flow-block 5.3.0 OFL-1.1 sha512-yVfLA6sUO7GoUxDSo1crs0309RhWiCSNivnI7IdWxI3S341+2mgckO9z9uPjjtjhKkyiJJIVmNcSjRV3vY+XkA==
flow-circular 5.3.0 OFL-1.1 sha512-tqomni6s0aeCaDkvBhO49+n9wKxgLf1oNzQf2dHZmksg7VTRnd4rPMB+fLgU024AVVWta8ZxPUqEDsHwzYBa+A==
flow-rounded 5.3.0 OFL-1.1 sha512-aBVAleAEBPIXg7VkgGfUrfAItJY3VDVUvMsn+y2geVVncrKb3V3lyX5l8M+EAjXND2+wq1fNYhlmGu4w95BITw==
forum 5.3.0 OFL-1.1 sha512-wZmonoit7JhG5usRNScbeNBzqnqijKD7Kzv6pRBXklVdwsADNarLG/5K6+XoCMx3JyBAwg52TxO+dretsomNrQ==
gabriela 5.2.8 OFL-1.1 sha512-ROxZCV82JoHGcgrVwPocvV88nVW0fIkLP+if7uEwHsBvvDQ3JHCfKIyBVh9qKB/AHe4b4g+Lmx2VRnNZ5CwQAw==
gentium-book-plus 5.3.0 OFL-1.1 sha512-FlcH8CWew00pv2w/o18pjpoz5PU7ETukXwnBqb7uhDXvlaEalXfAXP4TlXh+QlNrVkebALgfzhDLGV5sDNOSLg==
gentium-plus 5.3.0 OFL-1.1 sha512-b66LAeYwBdHu0NL9ESFiq9NBIn4vIbl+L1kFKbSv5rjg2fRqzPFMtzAaQnqvgfdIK12LbMJHvDtybMk9N5lsJw==
geologica 5.3.0 OFL-1.1 sha512-a8QzhXXHGedNmVm4/VKY3JZGBR2wGEYyIP3lbsExwxROmnN5kidT9eJrptrb8BfVSkoHZiAi03zZB6p6X2VMQg==
gidole 5.3.0 OFL-1.1 sha512-G4vwfk/2RhbVHWgkzO0Wl6v99XdJIq79Aqin+bGsKDeXrK5AtzeOUBY4a7FGuMF1PdF5/4kHDiDQOJgrvTnrbg==
golos-text 5.3.0 OFL-1.1 sha512-R+gM4qOZSrge4TtEGps0zTpU8X4e7e32L+3yy0J/2LnVB/IERlidEpXPWSZVGzTaL5QnPRVmoebRXSuVtjUIVg==
google-sans 5.3.1 OFL-1.1 sha512-vPaxyKtWMAecphz5CHerhBAIhnRNzQs0dn4KEr8d9Zx5MsoRBXZgFG43Lso2h7w46HVb7S+ku1sdVkGvONz1kQ==
gothic-a1 5.3.0 OFL-1.1 sha512-0HmmE3YQgdcXkVZd/pRTw7MOc9PffY7tNrR/dovEGO00cno/4ImiHxEXdJoq80Bs2jC52wuvuFRcepJ38mksEw==
great-vibes 5.3.0 OFL-1.1 sha512-1w60cXzXnC9V4y943po8044O1mqRQBiTTK75h7OpZE+1VQtx+KlAAzoIyEE5KNzu05gUpxaCQg7cbL7ITSwegQ==
handjet 5.3.0 OFL-1.1 sha512-rrUqofsRezu+8anI3xQunGyPxI2QlebqlHbqCFWEyuQbbVsbFTJA0xazFyKqitkT4e7EqpAMWh7sIWPmw4svAw==
ibm-plex-mono 5.3.0 OFL-1.1 sha512-eTgnZjZEGk1QtD3ZstF+Vclo2HLAni8YMy34/DxllwZvyz1lR/1RF/xTiAquOBO7MvqBx8D2Ig2WCPMVfdZu7Q==
ibm-plex-sans 5.3.0 OFL-1.1 sha512-CbE4CbbEEZJX860XyUiRpsksXIQR8Rp2XDva2VO53NJox9tVNtusrysd2x5YkUEY3ErQ66W1IiiQL8/wihhw5w==
ibm-plex-serif 5.3.0 OFL-1.1 sha512-zwPfHB7EJbS5B8qnitPigJYzNdnt6PUeaoOA1gAAt//1pjpTVZN5sOU14NIAZ+C1xypL6GWsUG2VMYJW9bhJqQ==
inter 5.3.0 OFL-1.1 sha512-RofMylZmjlJEfELXeNHFWBRcSs75rGU/6bV2S2jfnvv/3rPXPGe0LgUJTklcHZ9lM4OZmAVFhcJPnACfb91A3g==
inter-tight 5.3.0 OFL-1.1 sha512-uRwIrjKSUcCKIFeO2qm3yECA9phwge6Y1qQZvUmwqFgiIVWUELwwuq7pFlmlpPtO33ZtFQVOXQGNuvna1JPs6A==
istok-web 5.3.0 OFL-1.1 sha512-T9DrYnibpoFaZ46lxt1bNQqCuX6JIA+iKxLQAprDjYHDZvWLwoPj6QgwwnaNUgcADcCQX5SKaXqkdElp+CGmIA==
jetbrains-mono 5.3.0 OFL-1.1 sha512-fqDfB5I9f1p1TV486aUgB9t8zP84P0O1FtQR5Ol9vjwPy+S+EIGlVYm1cvj2W5shcZMTg2nZFdVMoH5wFu8a1A==
jura 5.3.0 OFL-1.1 sha512-0TNTRVaIiUp4Bw8RYrNgYUrq9flQIAUWnwZkrWe5aoY+FBTbMjxshKkAiVSsrW+SDLO0+wqjkqp944nKPIrRPw==
kablammo 5.3.0 OFL-1.1 sha512-e/VSimdHm9Sme6YFpNaiNFktTdyUKMcFcBucsDSqxDk6cjtdjimFvWTYnYlrtWC9Ct9qrhdflX+OZh8cp9NgDQ==
kurale 5.3.0 OFL-1.1 sha512-11AwW3mcsqnof17CVGcYc3VMphUsPkl+kl07v2LB726hd/KYiv6pXafNPO8Knhtr/I5g8nwIRnaOIUjZlxg8pA==
libertinus-math 5.3.0 OFL-1.1 sha512-Xar+auZQIVlVWzIIKE5ynMXyVSZGmN48JNAubWIzvQ2so+KklEbDkTKaP/FRDI0wXhWWoRbQ5bwmZh6dq25b1w==
libertinus-sans 5.3.0 OFL-1.1 sha512-DePvNVfVYTFW+Z2gAd6xB5WE25bmPpS7gPauLSPbiBGsTmcXKAIWymxgCh790OdMrDObpi8j8SY/fraip+L+QQ==
libertinus-serif 5.3.0 OFL-1.1 sha512-re9MYtKfLFxZxlcfV127IqG87wM7kYF9o//xfZufzsr2z22+tfKu5xRJwS9oMksI1fuyh5H9OWQFtVYM8ypiDg==
libertinus-serif-display 5.3.0 OFL-1.1 sha512-5WYkWY0zyTvJSqmQbVW3aLrOIXnfOe18g4Bl+djHolSj6vNDOm8k5IgJbX82sdwGIfaTMTGPpI1hlvZ/HUmnMA==
libre-franklin 5.3.0 OFL-1.1 sha512-owd+HDvD4hnGHG1jO3rHtg0BiNT0DJbZMaSqJ7g4r0646G5Q91MjTFWxZbpwg8njLu4BSH3EBqwkVSMLud6brg==
lilex 5.3.0 OFL-1.1 sha512-iSmg+PfNAlXotUVkXvxRhHaHC2OQeFRjWurb3AnJWPTmw+M6JZKIvj0MfwYjkdL5mCw5AiBSE2UxPAhN5Idh/g==
literata 5.3.0 OFL-1.1 sha512-9JGMT5+YfBK49thoMq9ASaMRJErHT4V4QuMhAEwKHRLreOsIMP2xP6ZRLhPJ0e6YlET+kjWTJuN7LAxt9/gWGQ==
lobster 5.3.0 OFL-1.1 sha512-jt+RDk/8Sstl1Omhox62gTbvRSLbh06kn5BNfDFgf4rNuDPHF+19eWYFxzq5FsdkalbRJNtc5p5C3qE0+leNVg==
lora 5.3.0 OFL-1.1 sha512-OK1g1z01rHVPqO5aw/FOIoDqc46KKYZdgL3NOLkxLWDk6QhDHhdr/h2BV1cke6gTvR1tzpDfdKyUkGsC+sQLeQ==
lunasima 5.3.0 OFL-1.1 sha512-30WRt/zNKUoKxwjeiOv5lPKDN0NTRZtkVbyA4GyxUYN1K2hFS/QdSOrYK+0Stp+jx5HAyxARR97K4y2KdjYD+w==
lxgw-marker-gothic 5.3.0 OFL-1.1 sha512-MydZ34u77iS9fu30OzHBa5eHDcBEL+D9UEi7LqMJRJIqDDyZuchxRb07m0MIZfdGrQiKwj0oSIBrLzPoa0TR2A==
lxgw-wenkai-mono-tc 5.3.0 OFL-1.1 sha512-cb4NqG1QUXP5jZ7Ub5vvMRgGwwifnE27qwads7Gja8gPXVzRHPugLmpja30KmYOosqe66g5sjKKZyFkeV+h2NQ==
lxgw-wenkai-tc 5.3.0 OFL-1.1 sha512-uH/YIfs+B6onN1JfvqzXG6of1i9so9/LCXQkblPWWqBSAoU6PzUELjBMEaLeOi5thnoFR68DqCfdlfA72oxHZw==
m-plus-1p 5.3.0 OFL-1.1 sha512-CunM07SjKhNp0nhIlp8x4QqeBqQx9bsR7Xrmm7A9riVt5TxFuKmFwDPT6Co9nnirguvsD9Ng+4pHM2uE7WbXmQ==
m-plus-rounded-1c 5.3.0 OFL-1.1 sha512-eB/JxJBRXLdfTsBDElsAZDMtHXM58Hf1tKkHoDVZAaUN7a+qYfwNKh4Q2f7Fk9YNg4xPFjTwooVlQyqbhi8CWQ==
manrope 5.3.0 OFL-1.1 sha512-obJ1Dv3+uCA6HlHgW8u4BGYxJR9In2HW7gjJhlflEvkrj1X1iSEwu0fToL+JYGC/FEKFfIz1sBuPduvcL2gIAA==
marmelad 5.2.8 OFL-1.1 sha512-EfYKDyRKXQS1sSdcMyZYKTMPci8QixkHF4JANbKM5TSkrvsi0KTENXbNFeif8Ay0cufjs59TL94pP7Noi2bIZg==
martian-mono 5.3.0 OFL-1.1 sha512-0iTnU6SZi6j5z4ymwlZGep6akvp/xWm+r+WyZO9hMfDJWX+dsFLipQp9zO02S0lkUQ+zAahcZNy3XLiNP+gVqQ==
merriweather 5.3.0 OFL-1.1 sha512-9LpPsNTYzRALj468Uj1K9Usl5eXk991L/kKmcpdWbTF1na9NfMyAXMgUABlMReViU1MYBz9kJ8jEzEOtX9qGDg==
moderustic 5.3.0 OFL-1.1 sha512-q8FSjwGM+ID0FOk/6FO0MP9VQKYpsa7thO0ZeQgtA5bTbpKJ39pSAjPzqLPiQfGi/3SHrjGNGukZPknbNu8Plg==
monomakh 5.3.0 OFL-1.1 sha512-FzeYm05Il8p3rZijTtHFKTZ0RApwuc2iPUhSiSgzbe+eLQJxJIobKZnDLeMGhyVZS3k3tX5SdQ3MHES/MDNp1A==
montserrat 5.3.0 OFL-1.1 sha512-iQPDtZOnmM5ih4JBGaMSXisRap0ixb9bAUw2hDtY7EjVfaqiiNlKtVuJl9XclxUwtwMMHNcWXfQR6zI9x05+Tg==
montserrat-alternates 5.3.0 OFL-1.1 sha512-PgdXHwkXQZ6YiE6aKgfFiMAn9vFf+5ADdVb95qMgJT/E/bvarrjeeTq+d8rWUAMvxpxn0jwFoGUNcvbzwSx68w==
montserrat-underline 5.3.0 OFL-1.1 sha512-u5NPHzfRt78NyGXTEplIiFGvHdmd2mtDNdCobd3xTEYn0ZUq+8/bDbIR4xxqZiyz8tKb/VrJTbuergJDoKkFyA==
mulish 5.3.0 OFL-1.1 sha512-Fru/fmJwg4ZlKUU4jELz6/guZhba6Lz1vraAROqooYnUbtj1iMi7BXFkQU7AkB6QP5swpvwRnO5chUp6mNh5mA==
murecho 5.3.1 OFL-1.1 sha512-liKtnI4RQr5oKtKM3PPDTd6Rz8ZvGKJaa0t66IAXM8yCppvz6almI6HLN2C00cXFGV3Gsz+poE3Nfz6XRliD/Q==
nata-sans 5.3.0 OFL-1.1 sha512-DsHr/GfEcIYr5dRDxa5IayGkRofCU093e+FihHLIXhzTs6AjdMcbVbknh/Wim4jQa49qtD1WlvE5eiFymfXo2w==
news-cycle 5.3.0 OFL-1.1 sha512-FYR97v6llb/+wXFWW+9AmUPSXE6mrfwOeEDdErh2NH7mKf1dqb7iPJWUTMRtApl09atP6qhD5C8jK6fmb0ydZg==
noto-sans 5.3.0 OFL-1.1 sha512-fBCog2PY7DiVVTEEqtI/Qdinx/knobHYfoGpjFXdfBX5RoJaBp1Prw2G75p0OIsdlMZg3cLo0c+YbIUYOxnQJw==
noto-sans-display 5.3.0 OFL-1.1 sha512-JTiBRAyKBVtGKlUiCQyaYE/S3Mx+uGUXhqkXCAMOZbP1Upjb4JWRzUdZfOYlvu5dK77+BWcDy3fXSn1N4Ja6ew==
noto-sans-mono 5.3.0 OFL-1.1 sha512-DPZ+/Ng9HP5UKiALCKtoeGfA7zJzEjHFB/18OU/c3+4I9zZ3eMVAuFZb0SqzT89Yj7KNhJFYnYjyDaVKhdRuUg==
noto-serif 5.3.0 OFL-1.1 sha512-ZrMzjuQlBIcw+qma1slZQdU3YDJvrjLG+9CWU1bxSf3YTkucwqd3EYa/Kfo4Ts19w8IMTGAmtOE3d6wWlgnBtA==
noto-serif-display 5.3.0 OFL-1.1 sha512-iVZR/eTQSfko9H0wZ0f+ogY5JSSH464nsRc7DZcsN0Kx7Qe41yg1IrQWILhe1dScyREMXceO+h+ar2kK9Wer8A==
nunito 5.3.0 OFL-1.1 sha512-vw9TaTQJ/zpEpKrsODuPmOvaVjXgdda6B+xXA4YqjrdeJ62MLgVoDerdRXFQHyBnSCt2yQ2nHKCHPP/Pv7Xq4Q==
nunito-sans 5.3.0 OFL-1.1 sha512-CctNhebQ2YYJUwVMCAkHexQg7yedfz9s8JzaETALyc9QIQuDFRlNTWXux9H5PsNLgptPkrzRDomAdLJt1sDFpQ==
oi 5.3.0 OFL-1.1 sha512-X1a9xBvHsFQiJ74hiyNBrnjuiWbQPV+LJWwBccqM2WV0xE3KJPSB7GKWQCD4SZrk8+8bkKgHUYJYuvo6vsqgvQ==
old-standard-tt 5.3.0 OFL-1.1 sha512-9cXU8XWqw4Pz9/9Lf6Otf1GPc0y17d96/nP9tzs4PLlq1IFMIxXszL3OLldaoyAn5YGr1r+tIXr0rlbgIeCYrg==
onest 5.3.1 OFL-1.1 sha512-2uA9HUzQHBB8H7T2R6inmrnqPofB6+svATHM/huIG640duJr4rm+uanmAIheTTlbZvRC0ujMtf2T4U4RX51oEQ==
open-sans 5.3.0 OFL-1.1 sha512-V1bdMlGNyZrJwzrdusshMOw2YR0aqYDL7kOo9dkxUEKl8dFv66A9HLckOOXl572sG/7ohhDQrCrTFGSn9LZcSw==
oranienbaum 5.3.0 OFL-1.1 sha512-AB9D7JTbWUceEExPfGMn4gaJ3a9wb4F60ijNQIB2xPILgSjXlyonCHGqCmjfxRZmuK5yaF0blFmU3sNrIx82Qg==
orelega-one 5.3.0 OFL-1.1 sha512-vjy0YGhXHtxGjMBmMUnrD0G3XKVUQueEpxuUo2V0osPwjIO4GNEnJPplny18CkS9V5DucWumTeiExC5Q/gpmNw==
oswald 5.3.0 OFL-1.1 sha512-16r2aHActe0pH+9FLdk/74/YxXM7HpGak05kAzx3RvSToiJwGvyhv6GvckPz+YuZmvL1nxWbEop2jAXRcXYPRg==
overpass 5.3.0 OFL-1.1 sha512-601DJ9xb8+8XbxAS05+lkh9cW6wc4TnXL2vhQBUN6PrtE/mQTgxqrqac7rXkthyJO7c3KMHOpl9Tt0sRql1p5Q==
overpass-mono 5.3.0 OFL-1.1 sha512-ORe1cIq1DZmEQ2/Y4N09YIKgzAfzn1ZlPfOQUEAIZTJiNaOQJonxCWbp9fsUQrp0h6j7+ebd9wIzkRv7YMaESQ==
pacifico 5.3.0 OFL-1.1 sha512-bWv0fHR1n36p7scRn+maaEaVeQCOq9yvfVfjyAeUzKrK4Y/3qiRAEj4hJgfxj/sjgZZGkeHyKPrbWdDaZtpCVw==
pangolin 5.3.0 OFL-1.1 sha512-3avtyqWX2QiQXKxVChWeVtF3FpB/wcojYXP13oO30WG44Ox9bCUHuHEtMd6NVgqpXSUqNLFaLm8K+29xVzkDZQ==
philosopher 5.3.0 OFL-1.1 sha512-jeycHVDesgFOcJkcsloZSqW/iVDAPd0/a9O5VRI3jmoIn1rNgedhJfosZpQttZHfsT+p28aLTmS61wAEjf9ljA==
piazzolla 5.3.0 OFL-1.1 sha512-TdNHvrECFtU5g3hYGDraUHBHwRlR60EGpBlf80IGpu0/puUrWTH79xeiNqPwxKcuC6pWKYFRD2mLXHoMB9BJkw==
play 5.3.0 OFL-1.1 sha512-VpI6fd/A3jT1J3bOuyHn01CioAqwGWwNReTGycrFF2D57An2EJhDAuG030up3Ho7jSy1sSGW85gtB+l/v3gXOw==
playfair 5.3.0 OFL-1.1 sha512-sJzt9x2B/gwmAqTiF4EgImtX8aXQ73HCa8sRs1OJyuEffJN7o8RN8F8MvAi5+YbAYDc8srjV5uSpuHlCKINTQw==
playpen-sans 5.3.0 OFL-1.1 sha512-94O9WdgAmvFpAjsPOgg5JZII4clcNeeMqQdNZh7Jz40rmcNv05jzwxyuw25IRjTb4o2aMV7eXjXC8GTFo/+s8Q==
podkova 5.3.0 OFL-1.1 sha512-6NfoTvQwHKklKIZmCCkrKckH5LbqiMAM8HFSOHZJd35i14m0Zy4BPcnzvCGtkPSGfOORrXzhq657+irmWLJ5gA==
press-start-2p 5.3.0 OFL-1.1 sha512-gxWFxdeDglPhEYSwEeooomcaFK8kSQYLQwVxfnOJeYRj2sPEHXjpVtFgEaYfqzOjuAJGrIcJOipu2KY5YkbyuQ==
pt-mono 5.3.0 OFL-1.1 sha512-AKXUTYCdv53jAJyzk3AEns6PdOvL3u+AD9Y4Ms6BFFRC7WCqYOvywujYT3gs00sMBIPs/J8iY7SQljk3wRfovw==
pt-sans 5.3.0 OFL-1.1 sha512-qisFKuquwSWlELeuQHQldOa4oSxDAOFpak2hj3FjFcdo4eCUGV0trhIBk3qt+Py50L8JKWHKnnL7/JPxRH0TPw==
pt-sans-caption 5.3.0 OFL-1.1 sha512-4fMVA/c9dkyBv5wFmGnaqJmRQe9Bu96RsVVLf6NQcTt5uYEOpV4k+s+LL78spmkfILYQIQUOSN8hkrfN2h8XdQ==
pt-sans-narrow 5.3.0 OFL-1.1 sha512-MVVT3W4L5TCuzSZAhsRQRWTGBhDOarcSBQ0PuuSJ44me4gMWRzz01waS/3XebrRKEyrSobted3E4aI2uudR/Og==
pt-serif 5.3.0 OFL-1.1 sha512-ST+j/byBGZw6H+TQMX78o6Qlngfj2Va/Q9fAJxq54Is1ZQk1/FhBIuqyJcLmnpi0trG8V/hWO9Bx6ZY09A0DBQ==
pt-serif-caption 5.2.8 OFL-1.1 sha512-Fy7+3Y1I09GGup0/O3uYKljM/i+WKCsfU6bx+ayiCJd3VqTF+8e4GF7wk5YSBHT2W/RrnTGYmOHl7V56wqJ7bA==
raleway 5.3.0 OFL-1.1 sha512-BTWr1I14Ji0DWpS/KCIq/CXcvxXWgMO73gynWpbYv7A5wlPhLevozgRmdPJvZmUf0fhH+Lju+F4nigJ6Ums24A==
roboto 5.3.0 OFL-1.1 sha512-BapRJOWYP+LZ21zp+wBQjfpPYKRoxc4LspJ/RLuI+HSMBD5u/X4O+ESDrSvEqDSy0rAl7GwBJ+09mdc16cVQ1Q==
roboto-condensed 5.3.0 OFL-1.1 sha512-Vbh5pesre/M/Jspd10btdKRqLSTe3yn4l6B2tXHGElCeASfA7Pgdpu1mb8wTG8E72J4Xk6FUfqnSe46UN2QAog==
roboto-flex 5.3.0 OFL-1.1 sha512-FzmARYZm9kZJ5OilGxlT8okfzn/skrXMLwkXSKqYmrL9TVZkgeX339nbK1M/fzNcqWCJ0NOv6g3Pp7bAjfiG+A==
roboto-mono 5.3.0 OFL-1.1 sha512-yhwplHMHW9dCk+1pZuERfcJe+K3rosGVZEoK0XktkxRSqQ9qsipSwwiuW2/8Qmtp9lzu3Ixa/ie4BMH3i8CkZQ==
roboto-serif 5.3.0 OFL-1.1 sha512-Q8FYJL6DSMAFZK58ktrEOnm/T6bIHQTZiqxXMqq5kID+43pQzszjr39ronjwT0ee21OQJTmv7myfQEtoLh7j0w==
roboto-slab 5.3.0 Apache-2.0 sha512-nrl4sOt5OIoMV3VecGVOnNAADU/8vz6+CLtLr4cCAf106hVtSLCTObPN8Z2KdZ03U01UDvgIp3hsu2TX3jen6w==
rubik 5.3.0 OFL-1.1 sha512-Nks2mn7vlE1jZVHuVgoKU2Ejqjvd+GJzLRdraCjo1xc79oo7O6vJ8pcvSfmKPGX3/Ln7nt09XWFzPeu2jWf0xQ==
rubik-80s-fade 5.3.0 OFL-1.1 sha512-5v1pM3LBFjOOba+zkqJ+C2UVcdoaHlCdcvuGgqmsCo9xVwZpvXiwBFaAqWqY56npb2NFwGvjwdCyTwTBQJ2BOg==
rubik-beastly 4.5.12 OFL-1.1 sha512-DHayhEQLJ18RMa5B69g74lA/9HMGVKeP2AleEdlnn8ost0o5yluXNmvn7TShFvS3TVUdSdiidtQgkbg/kKNrtw==
rubik-broken-fax 5.3.0 OFL-1.1 sha512-kEIN0x89Q/Or/G5LGOzWCiUX3iBd2elqOvY9UnTVNUj+GZITzUmhBU6kcGW4Pos5fI++a65wlezIbTDsQ+kuoQ==
rubik-bubbles 5.3.0 OFL-1.1 sha512-b0ZQsu6LTUFziwzdicuDNQnPI8+2ovufGMuAwjI+dMmjtsGz2u4ndYu+WSiNEF/XEgCU7f6B7HH45oqNAstUuw==
rubik-burned 5.2.7 OFL-1.1 sha512-NM+HLfaMkTnDQCXEWDL3bKV410CInrET21xcA5z28fMF2mwOmzUoyu2WLcVx1Ui2BshFyKnsOYT2gBNcC7vZQA==
rubik-dirt 5.3.0 OFL-1.1 sha512-EinXO2ePd/Bcn4k+qwr6q6MC/XGoCRsWJGllkth8SU3GUtJbVLoEF1Y7bpKku1EpcBhR9LDdhW2kJCQb5CcD9Q==
rubik-distressed 5.3.0 OFL-1.1 sha512-7rRnyyWUB2sAwkygycGUvfKKHT3lxE3LlmiDhLOgS+MppfTP0X1hFdn9rwK4f1BFN5fnAf7IbZRvbpa0OspanQ==
rubik-doodle-shadow 5.3.0 OFL-1.1 sha512-R7RlrZKhpkNsRUJXNSORQ2oLIi7HxUYdOl0iU1aSuSiTWO9/RvIRY1atxwuU7+hodUygecyLLA8XF0AOEbFDgw==
rubik-doodle-triangles 5.3.0 OFL-1.1 sha512-8lSi5ljRxCld1+tgGNFy1RoA2y6/jFI39LUojpGQC3P9lur0Yzj5aKEt8NFOwdka196gh7zAMHLRPM7Khl0b/w==
rubik-gemstones 5.3.0 OFL-1.1 sha512-sk8kCgKMP1l68Fd3c0b0S1W7kyKKi/dY8A6gNLccf0bq92OtMZkjYF0aN9WrHgYV9SHsGoT7Vrb/WtA/mXghSg==
rubik-glitch 5.3.0 OFL-1.1 sha512-TUe1qXVF+5IeMWU73HvfDdao9IssUK06hOHOdF8QKmPJj36pWGLVtdFWUgHGQQjytxpWitSHgmcJ7DkiWmTXQA==
rubik-glitch-pop 5.3.0 OFL-1.1 sha512-1OJwQXQPBUpGrVAVlWTTz43ZR3t3PqwRmQbhrrCxELlBiE+xSQsjFzhFT0Rif9Hxc4aq0rCg8zk1zzPcNl6RPA==
rubik-iso 5.3.0 OFL-1.1 sha512-eweQPRw25yXYXnUCYMtEhGeA0XbY0gCxcS0plJcaQpG3KrWNZjXw56T8cw8RaqjsC2HzGPWObp+5PhhCZA+huQ==
rubik-lines 5.3.0 OFL-1.1 sha512-9BGqp7KAt9H47my2/vMPnbbvApQ5Vr+sgFA9INrUbaF1H80ariK53gVy7GYtlsSwRKT1LRkmpwYowsGeGfVU1A==
rubik-maps 5.3.0 OFL-1.1 sha512-WIxFqZBVHv481o3ZB+rABoVa+bjlzCCyU1m3BOWNLWpAf5LH0P0VLoaXzuOnQlAujAC/X5nm3X5Octp9hFBhgg==
rubik-marker-hatch 5.3.0 OFL-1.1 sha512-wSkBQ0qza5hDJAWHGJ12Covp5zRfqwFTgdgdTvDNXOc1GgnmTdlHg9UYXCmpXVGuwXBXVD1v2ZaKhU5stNDKmA==
rubik-maze 4.5.0 OFL-1.1 sha512-3z2qje0aP3scOOjMdCVAgF0/0UWT5nrg0RPlUgVsZqMGkWWpGrtxSdAIW/7kQ3udGiej5gExweq5x+8OvCSiYQ==
rubik-microbe 5.3.0 OFL-1.1 sha512-LoyG3lp6FJ4mzodZJE6LfbO2tuKitaAyqmg80ApPawTrYMbcrQRuJWIbn5mwDolPe1xhqD9G8bs+Fp9eIEtd8A==
rubik-moonrocks 5.2.8 OFL-1.1 sha512-udcJNsLsfq6J2jSKtHtQrYomwjZBhzy01gLQoBsk4vleeKHYH3UIKNwhe1o6z0JwgH3FMTr97BbYO+JXNJFWfQ==
rubik-pixels 5.3.0 OFL-1.1 sha512-lm2q7l5F2mvCG1L878dQcJXcb2E8S67c9LO8+bGhrJzQCqPX7kyBylLcuMg/kRUCO1iEw9KBg+9A6fyLPtQMSQ==
rubik-puddles 5.3.0 OFL-1.1 sha512-gYAycnVMmFHt3WyZVbumUju/M3PReS3zCZkCVDTsgSoSe/Av6CQdhiD6D1l034c7KQI7+Vje9K7QW8FBMnEsrA==
rubik-scribble 5.3.0 OFL-1.1 sha512-Dy3Zo5i5bVQwca08BZoC8z9KqlJqnsxNAhGedtn6dBDxVmfgY/DmlQnGbZpgLilI1e9oiTu9s6ZrY0ZuwI4y8w==
rubik-spray-paint 5.3.0 OFL-1.1 sha512-LyBjEpt22JySVawJGCS3KNwZImP1Q5e6qcW341lmNjQq8lWXvqDWuo6rPDNLgNAROi+SMIwEo5El8k28ZNPMKQ==
rubik-storm 5.3.0 OFL-1.1 sha512-idHwXOqLTGkcCKRdTsUz0wzDhczBtm01Tj1UI2pg6zRzR8YN7ozq/FB2fr/AfPWqle2yHFqbIEy/mjbeIFS5dQ==
rubik-vinyl 5.2.7 OFL-1.1 sha512-T3YJnIW3w1dszx/0rrOs5b0skugE/KHZ2Ca0rpAxdlYUIWYINdtgfUxjHJkegvfZ50qBWJRSx+WsYvtzstCm0A==
rubik-wet-paint 5.3.0 OFL-1.1 sha512-nPEMWjlPzZgXd8E1N5zXJuIYfjjuKEa209rhEaTLlVZJAklmtGOPIauUuTT0U0m4nDPR8BOFd0WZoaru8plTMg==
sansation 5.3.0 OFL-1.1 sha512-Z35taJZuw2+pHu+I37V0zCSRJnLViP6vne92wpAjrRnrDEL0wj1SqJzzItD1wCy8jeK21sBBTWyCvJAnW2mzQA==
scada 5.3.0 OFL-1.1 sha512-MI7cjzwBw7AzOrO//4QVNxVMWhpTAgKe+VcY0UMCLsFJcwpdWnI+5UF220Y6bNRsGgY1ya3POII1N4V60tVelg==
science-gothic 5.3.0 OFL-1.1 sha512-QWs9FRPJXdth0BLeimMGFruQXSiv1F2+NR6PSuFKk4N1u492brjTF9eE7TdgIdCeOzmbpm9eSJSx8kNnDTPJiw==
shafarik 5.3.0 OFL-1.1 sha512-WhVHf21cSealszfC00lrXnTHJHh0PpwBxidjA0OzCo1KytuwmePGXDav5KinTnOq2MIGyQoOfIQDJEchm5P/sQ==
shantell-sans 5.3.0 OFL-1.1 sha512-hVKmS5EO/xGOtKx+rHuyqIsswjWp5bb91DlszxSkO4jEqOSaRIjYH/iu5gJ7QVszDlofoezZeWM5OdKgyE2jtg==
sofia-sans 5.3.0 OFL-1.1 sha512-3ozStPhvt1/8deVKJkzOzyl0uVUSaB2AEbiw3r7gxRTq8Ax3TxV2qBnPbPq8+0X00R5+qwO2yUWBLCh+on37rw==
sofia-sans-condensed 5.3.0 OFL-1.1 sha512-JGT4shg12OGB5duffcyG5uCSAK/AfNHzxIYUlB6DOmTE4bwGPny6fVxq1F9pZ9usJ53hl37h0mUxxmC4RqzSXw==
sofia-sans-extra-condensed 5.3.0 OFL-1.1 sha512-2e4gWBJn8sUJMoQx6VTpXIlPIezZpyjJLEstaSZb9nOkQLwP8+kr48dOJEYVo0t3iqCYvQUjbpLIbpgPICfmkw==
sofia-sans-semi-condensed 5.3.0 OFL-1.1 sha512-zqubLbT0ruDFqn0cVp1/19jBxEYrZdiNX5ZWLfmGsMLYgj9jK5O9Td9nLyV+AD8kMurWoBJn1vEgYRoTNZ9pkA==
source-code-pro 5.3.1 OFL-1.1 sha512-qsJEkwJWXYP/9clmtt3BsIlZ+Lr4cuRgNAgu0vyZdCgESMRMhRkAmEFFHHNM81VdeURqg5D5+Rr3bALDFav78A==
source-sans-3 5.3.1 OFL-1.1 sha512-O3YxvbotUOgYI2Zx0bBcEMNjnwitRf9P2+9pd54sMoux1NHrdXnMwZusw2P78lFhEzOPN4glOEQmX0ASaS68uA==
source-serif-4 5.3.1 OFL-1.1 sha512-cWcTCXjYYrgF9A67fThVir1VSc0lPEYmwQ6jA4pPt01s2MSCi/maINUcZoCzaqnU8fyUReDO97eGcBUkHgOeug==
spectral 5.3.0 OFL-1.1 sha512-2TL5WWGOZj4SIsBmPFEzKeA60tXXd1Qp1OqaaVEWkJL8IfSGLk6YmiusmC441iFkdJDIuFelu1r8lhCmQUU3mw==
stix-two-text 5.3.0 OFL-1.1 sha512-/eVTBPvodwIlsUTImyGjNVG4wqi2SDi6nV0WmE0+ScfbCegC8zMkm6BER8dy8f900xgP1RkNx0HxjbixT/ISOg==
tektur 5.3.0 OFL-1.1 sha512-Yp5ejjv/9+bxoT2zl6aKI3uBkuwLJ/aA+yAf1e9iUoaj6iE26QDL78pKTbpZj0+sm3gSOjy0p1XyKmnIGyCD9Q==
tiktok-sans 5.3.0 OFL-1.1 sha512-jPNuCSLoHTa3p6LZB7K92XQKDY7DzJcCGoHrQmP28AmFe2CO+m+xUgTK4rHphb6KR0+i6kUQDgFEle/X2rcuSQ==
tinos 5.3.0 OFL-1.1 sha512-VVDyyZdbcsLKxo/W7rClAvacD/7DsGc7J5xzzp51Tndib8kDkEe/0bqbb3Xb3iH6+IUjt07aRsvtQ9MGeGGi4w==
tiny5 5.3.0 OFL-1.1 sha512-29H01ByMRs6uiLeOoBnZLedf0dR3pF5A53cIBzhp1/Y6Bu5D0t5selTb4TWs3ENoc/OK71rOed5xAdvBywe4aQ==
tuffy 5.3.0 OFL-1.1 sha512-VzAQYvtsz6/+zo4ByS5afkgYYACXsp4JrlY2vYGcg1sYxDhztTf2r4J9XxwXxGFmAscOhDNL4Y+XBLHafMLZ+w==
ubuntu 5.3.0 UFL-1.0 sha512-LsjJXgE430QLs8LKfn1RIFbbdGAiZBU1gao8ASa4Z2kGNGh7lMb7Rzx09v3bLLuuK+3XA/JSLgPWTAbLD6r1fg==
ubuntu-condensed 5.3.0 UFL-1.0 sha512-xbxTJMlsN96ptF+AWgkbhR1gOt53Fb6+ZZgAfpG/twvHh4AG0sQoBbIBVT2I7Maqu3d2EetJHoW/mqCszDTzzg==
ubuntu-mono 5.3.0 UFL-1.0 sha512-hLwLkeAV9YvLSOWExn0heOXy+EB4wKnt648qS5FaqsiCZDS8X9kR/ueIBzzX/vNSXjFkhLRSTKqlOfFvHdD4Bw==
ubuntu-sans 5.3.0 UFL-1.0 sha512-hTx2FNTv4w3aRyP+GPfrMqoUn9QSp6YclXCLeuihWnK9I4V/hmHKaCkJ0dW1SVpx91ZoyzgC3uJxyOY6uDIlbQ==
ubuntu-sans-mono 5.3.0 UFL-1.0 sha512-7SGXQ43Q+gq7kSU2SMaHDBP5injQ07c0hYFsO5lwYT51WQ6qs2mO+lGfzb8Y6yTUZXuQFj2X4MyMZuvumu4TAw==
unbounded 5.3.0 OFL-1.1 sha512-pPD6hsTnjoQRr6pCsqMHbHBfauB4LZygCNQEUJHu+CO2wzDFHqELEFSG7sTwo5Z5Gr4q3OK0fIILOXBJDv6lcw==
viaoda-libre 4.5.9 OFL-1.1 sha512-y8ZxOoznOJx73uOegPhpMpz3MBIix31+DZzeXtpx8eI5LaFeh7sgjku31OczpIy8KcrEkYYnhZrq0yf7lQrgIQ==
victor-mono 5.3.0 OFL-1.1 sha512-4U33jWYiEKLDHYuQGONZWJRCg9HD5XCLtPIzJfIxxstFgn9S1YYcaOoPTPc4cPMyjH5woTRFk8NMfax5AmfsMw==
vollkorn 5.3.0 OFL-1.1 sha512-ES6Z36o16TZTKigivtUc8s4ZJ5rOSjU1dBNjESCCL5u+x2JaP2RoinQqg+tUOYULPJ9rNvqZUPRSIznVvg1A/A==
wix-madefor-display 5.3.0 OFL-1.1 sha512-APPTGYDILe1swgUKE2gfo4PmkPxJiWv2eC3uoT6Tmg0BleklXw5wFAUdgVTD0VQloJvUNx1g0nfdUWGH1ZUvEw==
wix-madefor-text 5.3.0 OFL-1.1 sha512-LdaZ0ES+1YSV1g8vRZYcBAo0f72dS6oOMPcvtcKcuj5g+X632vTrhyWcJPdwc/6m/YnYRToJhKR0I3/38BafnA==
yanone-kaffeesatz 5.3.0 OFL-1.1 sha512-BPu2PHqPswEz9jgxrEO+3+hYe2bGo29wFvLyelAIcpTNah/jSUa9D/Uf/obV/h8giU6Or4NA8wtWxlZfjpxLgg==
yeseva-one 5.3.0 OFL-1.1 sha512-9R6Rk4nInFQnnoghsjsGN+3EqE9Pb4OjfV9rUy20uqFGjs7r1Z/miSVvM0HMYK21y1RVIzALCtuHifCfzN/gSw==
ysabeau 5.3.0 OFL-1.1 sha512-Dx0Fv1aBgv16HOGbw4QLGaCF6pQR2ny4FrWwtu+GE81lqYhVAaN3jH/8gv8PinCa58IiCqSdCOrxCmwOpvXFCQ==
ysabeau-office 5.3.0 OFL-1.1 sha512-n0i8rGPZ2E0Cbml20purw9HhP/BYa8LmXy6ts7Wv+tMaeUhM/qkF02vfRM4ns1Y0lSWiyDsq5htXeBrrFnR9Dg==
zen-antique 5.3.0 OFL-1.1 sha512-G9iu1kgpr0MvBWVoR+DjoVMgK5zdVVeMQ+qdHJ42ec8Ag+574uWuykjMbOn9Nfq560swzixiTNdMlWoNzzyCAg==
zen-antique-soft 5.2.8 OFL-1.1 sha512-J8HHxLL6fs0bz/3NyQN+PUuNtskWJK6qLsndEjSHkmoadgcAf2OUUm33L89eew1h13pxgDZWeYIPJXRaus6W0A==
zen-kurenaido 5.3.0 OFL-1.1 sha512-Oh7XLWpdTV7/f6xgdw3pmDPpu8OHEdXu9QEL2TEjoBeg85z1qWMb4lvQYDtNQx6gaERvKQ0OrgvpS3S/ka/+bA==
zen-maru-gothic 5.3.0 OFL-1.1 sha512-BuigfmzszMR3AOyAMSocQZ9bEq9o5sGCMOC/laI4TMpba1/KB1jxsdNFXWMUz02wVPd4vAVuMhsV00AQizFj3w==
zen-old-mincho 5.3.0 OFL-1.1 sha512-pNvegTkx6rOQRaBMcUoxxeNoIRJajdY0TeX4ngf/26KrtsVoqY11ho6WlwPWDYHi7PY65vf88TV2xjIO+YxQ8Q==
"""


def parse_pins(table):
    """({font id: NpmPackage}, {font id: licence}) of a PINS table."""
    packages, licences = {}, {}
    for line in table.strip().splitlines():
        font_id, version, licence, integrity = line.split()
        packages[font_id] = NpmPackage(f"@fontsource/{font_id}", version, integrity)
        licences[font_id] = LICENSE_NAMES[licence]
    return packages, licences


FONT_PACKAGES, FONT_LICENSES = parse_pins(PINS)
